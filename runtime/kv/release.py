"""Release, preemption and abort: the layer of `KVManager` (kv.manager) through which a request's pages leave it.

`release` (a finished request) and `preempt` (a running one put back to WAITING) give the computed KV to the tree up
to the admission limit (`_give_back`), free the rest and unlock; a finished request with `retain_for` takes a lease on
what the tree holds of it (kv.leases). `abort` frees everything in any state, keeping what was committed.

Invariants: afterwards the request holds no block and no lock; only adopted pages go down the tiers and to the event
log (kv.adoptions), and a fault there is raised only once the manager is consistent again; the tree never takes back
a page it already holds, and declined pages are counted (`declined_pages`) and freed.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixcache.policy.reuse import tell_output_length
from radixcache.runtime.kv.commit import Committing
from radixcache.runtime.kv.leases import NO_LEASE
from radixcache.runtime.kv.state import KVState, Status


class Releasing(Committing):
    """`release`, `preempt` and `abort`: a request's pages out, to the tree or freed."""

    declined_pages: int  # (set in KVManager.__init__)

    def release(self, kv: KVState, tokens: Sequence[int], output_tokens: int) -> None:
        """A finished request (`tokens` its ids, `output_tokens` of them generated): give its computed KV to the
        tree (positions `< num_kv`), unlock its match and free what the tree did not take (the unaligned tail page
        and any unused page)."""
        if kv.status is not Status.RUNNING:
            raise RuntimeError(f"request {kv.rid} is {kv.status.value}, not running")
        kept = self._give_back(kv, tokens, output_tokens)
        self._adoptions.finished(kv, tokens, kept)  # used until now: the lower tiers' recency (docs/tiers.md)
        kv.status = Status.FINISHED
        if kv.retain_for is not None:  # asked for a lease: say what it got (kv.leases)
            grant = self.leases.grant if self.enable_cache and kv.retain_for > 0 else None
            kv.lease = grant(tokens[: kept * self.page_size], kv.namespace, kv.retain_for) if grant else NO_LEASE
        self._adoptions.raise_fault()

    def preempt(self, kv: KVState, tokens: Sequence[int]) -> None:
        """Take a running request's blocks back: its computed KV goes to the tree (evictable), everything else
        is freed, and it waits again to be resumed."""
        if kv.status is not Status.RUNNING:
            raise RuntimeError(f"request {kv.rid} is {kv.status.value}, not running")
        kv.computed_max = max(kv.computed_max, kv.num_kv)
        self._give_back(kv, tokens, None)
        kv.num_kv = 0
        kv.preemptions += 1
        kv.status = Status.WAITING
        self._adoptions.raise_fault()

    def abort(self, kv: KVState, tokens: Sequence[int] | None = None, *, status: Status = Status.ABORTED) -> None:
        """Free every block the request holds and drop its lock, in any state. Pages it committed stay in the tree (a
        failed pass committed nothing), refreshed in the tiers as at `release` (hashed from `tokens`, its ids)."""
        if self.tiers is not None:  # a prefetch still reading: stop it, unlock the host pages it held
            self.tiers.cancel_prefetch(kv.rid)
        if kv.pending_load is not None:  # its blocks are freed below: the copy left is dropped
            kv.pending_load.drop()
            kv.pending_load = None
        if kv.status is Status.RUNNING:
            self._adoptions.finished(kv, tokens, kv.tree_blocks)  # a cancel ends its use too, as `release`
            held = kv.held_blocks
            del kv.block_table[kv.tree_blocks :]
            if held:
                self.cache.free(held)
            kv.block_table = []
            kv.tree_blocks = 0
            self._unlock(kv)
        kv.status = status

    def _give_back(self, kv: KVState, tokens: Sequence[int], output_tokens: int | None) -> int:
        """Insert the request's computed KV up to its admission limit, free everything else, unlock. Returns the
        pages (from the root) the tree holds of it. `output_tokens`: None while the request goes on (a
        preemption), else what it generated."""
        if not self.enable_cache:
            self.abort(kv, status=Status.RUNNING)
            return 0
        self.load_layers(kv)  # the tree takes the pages below: every layer first
        cache, p = self.cache, self.page_size
        used = self.pages(kv.num_kv)
        spare = kv.block_table[used:]
        if spare:
            cache.free(spare)
            del kv.block_table[used:]
        full = kv.num_kv // p
        keep = full  # pages the tree adopts (or has): never fewer than it already has of ours
        if full > kv.tree_blocks:
            keep = max(kv.tree_blocks, min(full, self.admission_limit(kv, output_tokens=output_tokens)))
        # Every page is offered (the tail page too, which the tree leaves to us) unless some are declined.
        n = kv.num_kv if keep == full else keep * p
        if n:
            head = tokens[:n]
            tell_output_length(cache.policy, output_tokens)
            cached = cache.insert(head, kv.block_table[: self.pages(n)], namespace=kv.namespace) // p
            tell_output_length(cache.policy, None)  # spent, or unused when every page was in the tree already
            self._adoptions.adopted(kv, head, cached, keep)
        # The tree now owns the first `keep` pages (duplicates of cached pages went back to the free pool); the
        # declined pages and an unaligned tail page are still ours.
        mine = kv.block_table[keep:]
        self.declined_pages += full - keep
        kv.block_table = []
        kv.tree_blocks = 0
        if mine:
            cache.free(mine)
        self._unlock(kv)
        return keep

    def _unlock(self, kv: KVState) -> None:
        node, kv.match_node = kv.match_node, None
        if node is not None:
            self.cache.unlock(node)
