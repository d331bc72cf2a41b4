"""The engine's only door to the radix cache: a request's KV pages from admission to release.

match and lock -> allocate -> commit each computed chunk (in flight) -> grow while decoding -> release.

Every method leaves the cache's invariants true, also when it raises: a request either holds its lock and blocks
(RUNNING) or holds nothing (WAITING, FINISHED, ABORTED). A tier copy or an event publish that raises while the tree
adopts pages is held until the commit, release or preemption under way has finished, then raised. A request's
pages, lock and accounting are one `KVState` (kv.state) that the engine creates and this manager mutates; each
method takes that state and plain values (the request's token ids so far), never the engine's Request, so `kv/`
imports nothing of `engine/`.

In-flight sharing: `commit` gives the tree a running request's computed full pages as soon as a forward pass wrote
them (each prefill chunk, each page a decode fills), still locked by the request. Another request that arrives
meanwhile matches them like any cached prefix. A page that another request inserted first replaces our duplicate
(the tree frees ours) and the request's block table follows the tree. Preemption gives a running request's
computed KV to the tree (evictable, so that its resumption hits it if it survives) and puts it back to WAITING.

Admission (radixcache.policy.admission): the tree adopts a request's pages only up to its `admit_limit`, the policy's
answer, asked once per request, the first time its pages would go to the tree (its first commit, or its give-back,
with the known total when it finished) and kept across preemptions. Pages past the limit stay the request's own
blocks: it reads them while it runs, and they are freed when it leaves (a preempted request recomputes them). Pages
already in the tree are never taken back, and only adopted pages go down the tiers and to the event log.
`AdmitAll` (the default) adopts every page: the behaviour without admission control.

Leases (kv.leases): a request that finishes with `retain_for` seconds takes a lease on the pages the tree holds of
it; each admission renews the leases its match reaches, and leases past their deadline are released before
anything here allocates (and so evicts). When an admission or a decode's next page cannot be found, the oldest
leases give way first: a lease never fails a request.

The last token: its pass makes the next token's logits, so at most all tokens but the last count as cached. A match
that reaches it (the same prompt again, a parallel sample) keeps that token's page: a tier page is loaded into a
block of the request's own as usual, a tree page copied into one (`copy_page`): one token is computed, not a page.
A tree page not copied (a resumed request does not need it; no block is left beside it) is left out of the lock.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from radixcache import RadixCache, TreeNode
from radixcache.node import path_blocks
from radixcache.policy.admission import AdmissionPolicy, make_admission
from radixcache.policy.reuse import tell_output_length
from radixcache.runtime.kv.adoptions import Adoptions
from radixcache.runtime.kv.leases import NO_LEASE, LeaseTable
from radixcache.runtime.kv.pins import PinTable
from radixcache.runtime.kv.retention import RetentionPolicy
from radixcache.runtime.kv.state import KVState, Status
from radixcache.tokens import as_token_array

if TYPE_CHECKING:
    from radixcache.runtime.kv.events import KVEventLog
    from radixcache.runtime.kv.tier.coordinator import KVTiers


class KVManager:
    """Admission, growth, in-flight commits, pins and release of requests' pages in one RadixCache.

    With `enable_cache=False` it allocates and frees blocks the same way but never matches, commits or inserts,
    so nothing is reused (the baseline). `max_pinned_blocks`: the most pages pins may lock (kv.pins).
    `admission`: how much of each request the tree adopts (a name in radixcache.policy.admission.ADMISSION_POLICIES, a
    policy, or None for "all"); `declined_pages` counts the computed full pages it declined (freed instead).
    `copy_page(src, dst)`: copies one block's K/V (every layer) into another; without it, a match that reaches the
    last token gives up that token's page and it is computed again (see "The last token" above).
    """

    def __init__(
        self,
        cache: RadixCache,
        *,
        enable_cache: bool = True,
        retention: RetentionPolicy | None = None,
        max_pinned_blocks: int = 0,
        tiers: KVTiers | None = None,
        events: KVEventLog | None = None,
        admission: str | AdmissionPolicy | None = None,
        max_lease_blocks: int = 0,
        lease_clock: Callable[[], float] | None = None,
        copy_page: Callable[[int, int], None] | None = None,
    ) -> None:
        self.cache = cache
        self.copy_page = copy_page  # (source block, destination block): one page's K/V, every layer (KVPool)
        self.tiers = tiers if enable_cache else None
        self.events = events if enable_cache else None  # stored/removed page keys for a router (kv.events)
        self.enable_cache = enable_cache
        self.page_size = cache.page_size
        self.retention = retention
        self.pins = PinTable(cache, max_pinned_blocks)
        self.leases = LeaseTable(cache, max_lease_blocks, lease_clock)  # kv.leases: finished requests' pages, timed
        self.admission = make_admission(admission, eviction=cache.policy)
        self.declined_pages = 0  # computed full pages the admission policy kept out of the tree (freed)
        self._policy_failed = False  # warned once already
        self._adoptions = Adoptions(self.tiers, self.events)  # where adopted pages go next; their deferred faults

    def pages(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    # ------------------------------------------------------------------ admission

    def admit(
        self,
        kv: KVState,
        tokens: Sequence[int],
        end: int,
        *,
        reserve: int = 0,
        strict: bool = True,
        defer: bool = False,
    ) -> bool:
        """Match `tokens` (the request's ids so far: a fresh prompt, or a resumed request's prompt and output), lock
        the match, and allocate pages up to position `end`, evicting if needed. At most `len(tokens) - 1` positions
        count as cached (the module's "The last token").

        `reserve`: pages that must stay free or evictable afterwards (headroom for running decodes). When the
        pages are not there: with `strict`, raise CacheFullError; otherwise return False. Either way nothing
        is held then. The first admission (never preempted) sets `cached_tokens` and `found_pages`; a resumption
        counts what it computes again as `recomputed_tokens`. `defer`: disk pages are copied into the pool layer by
        layer (`load_layers`, for a chunk staged by layers) instead of now.
        """
        if kv.status is not Status.WAITING:
            raise RuntimeError(f"request {kv.rid} is {kv.status.value}, not waiting")
        cache, tiers, tier_match, node = self.cache, self.tiers, None, None
        blocks: Sequence[int] = ()
        host_hashes: list[bytes] = []
        disk_pages = 0
        self.leases.expire()  # before anything here can evict: a lease past its deadline holds nothing
        if self.enable_cache:
            if kv.page_chain is None and (tiers is not None or self.events is not None):
                kv.page_chain = (tiers or self.events).chain(kv.namespace)  # type: ignore[union-attr]
            if tiers is not None:
                tier_match = tiers.match(tokens, kv.namespace, kv.page_chain)
                match = tier_match.device
            else:
                match = cache.match_prefix(tokens, namespace=kv.namespace)
            node, blocks = match.node, match.blocks
            cache.lock(node)
            self.leases.renew(node)  # a hit on a leased context renews its lease
            if tier_match is not None:
                assert tiers is not None
                try:
                    host_pages, disk_pages = tiers.plan(tier_match)
                    # no more than the new blocks up to `end` (page size 1: a resumed request's last token has none)
                    room = max(0, self.pages(end) - len(blocks))
                    host_pages, disk_pages = min(host_pages, room), min(disk_pages, max(0, room - host_pages))
                    host_hashes = tiers.lock_host(tier_match, host_pages)
                except BaseException:
                    self._unlock_all(node, [])
                    raise
        p = self.page_size
        cap = len(tokens) - 1  # positions that may come from the cache: the last token's pass makes the logits
        cut = last_page = None  # a tree block holding the last token; last_page: copied into our first new block
        if blocks and len(blocks) * p > cap:  # the device match ends at the last token (no tier page follows it)
            cut, blocks = blocks[-1], blocks[:-1]  # the locked node still covers it: it stays put until copied
            last_page = cut if self.copy_page and len(blocks) * p < end else None  # if it holds positions < end
        try:
            need = self.pages(end) - len(blocks)
            while need + reserve > cache.free_blocks + cache.evictable_blocks and self.leases.give_way():
                pass  # live work first: the oldest leases give way
            if cut is not None and (last_page is None or need + reserve > cache.free_blocks + cache.evictable_blocks):
                # Not copied (not needed, or no room beside it: its tokens are computed), the cut page leaves our lock
                # and may be evicted for our pages: else a pool that it fills exactly refuses the prompt it holds.
                short = cache.lock_prefix(tokens, len(blocks) * p, namespace=kv.namespace) if blocks else None
                self._unlock_all(node, [])
                node, last_page = short, None
            if not strict and need + reserve > cache.free_blocks + cache.evictable_blocks:
                self._unlock_all(node, host_hashes)
                return False
            new = cache.allocate(need)
        except BaseException:
            self._unlock_all(node, host_hashes)
            raise
        loaded = 0
        try:  # a tier load unlocks the host pages whatever happens
            if last_page is not None:  # (then no host or disk page follows the device match)
                assert self.copy_page is not None
                self.copy_page(last_page, new[0])
                loaded = 1
            elif tiers is not None and tier_match is not None:
                loaded, kv.pending_load = tiers.load(tier_match, host_hashes, disk_pages, tokens, new, kv.rid, defer)
        except BaseException:
            cache.free(new)
            self._unlock_all(node, [])
            raise
        matched = min((len(blocks) + loaded) * p, cap)
        kv.tier_pages = 0 if last_page is not None else loaded
        kv.match_node = node
        kv.tree_blocks = len(blocks)
        kv.block_table = [*blocks, *new]  # a list: the table grows and its tree part is rewritten in place
        kv.num_kv = matched
        if kv.preemptions == 0:
            kv.cached_tokens = matched if kv.cached_cap is None else min(matched, kv.cached_cap)
            kv.found_pages = len(blocks) + loaded
            if tiers is not None:
                tiers.count_hits(matched, len(blocks) + loaded - kv.tier_pages, min(kv.tier_pages, len(host_hashes)))
        else:  # a resumption: what it computes again is recomputation, not a miss, and its hits are not hits
            kv.recomputed_tokens += max(0, kv.computed_max - matched)
        found = tier_match.hashes if tier_match is not None else []  # to the end of the tiers' match
        if tiers is not None and (blocks or loaded or found) and kv.page_chain is not None:
            # The lower tiers' LRUs see their own reads only: a prefix every request hits on the device would go
            # first. The run found is refreshed in both, hashed later where the match did not (KVTiers.refresh),
            # with the pages found below and recomputed (a declined or failed load: used all the same; the disk
            # stamps the pages a request adds just older than their run, not newer).
            tiers.refresh(
                found if len(found) > len(blocks) + loaded else kv.page_chain.deferred(tokens, len(blocks) + loaded)
            )
        kv.status = Status.RUNNING
        return True

    def load_layers(self, kv: KVState, stop: int | None = None) -> bool:
        """Copy a deferred disk load's layers up to `stop` (None: all) into the request's blocks, before a pass
        reads them (kv.tier.layered_load). False when the copy raised: a failed read, as an eager load's is
        (docs/tiers.md): the load is dropped and the request's positions end before its disk pages, which it
        recomputes (a chunk under way is to be run again from there)."""
        load = kv.pending_load
        if load is None:
            return True
        try:
            load.copy_until(stop)
        except Exception:
            lost = kv.drop_failed_load(self.page_size)
            assert self.tiers is not None
            self.tiers.failed_deferred_load(load.pages, lost if kv.preemptions == 0 else 0)
            return False
        if load.done:
            kv.pending_load = None
        return True

    def reserve(self, kv: KVState, num_tokens: int) -> None:
        """Make the block table cover `num_tokens` positions, allocating new pages (evicting if needed)."""
        missing = self.pages(num_tokens) - len(kv.block_table)
        if missing > 0:
            self.leases.expire()
            cache = self.cache
            while missing > cache.free_blocks + cache.evictable_blocks and self.leases.give_way():
                pass  # a decode's next page before any lease
            kv.block_table.extend(cache.allocate(missing))

    def mark_retention(self, namespace: Hashable, prompt_ids: Sequence[int], retention: int) -> None:
        """Give a prompt its retention priority (kv.retention), if it asked for one."""
        if retention and self.enable_cache and self.retention is not None:
            self.retention.mark(namespace, prompt_ids, retention)

    # ------------------------------------------------------------------ sharing while running

    def commit(self, kv: KVState, tokens: Sequence[int]) -> None:
        """Give the tree the request's computed full pages now (in flight), so that other requests hit them while
        this one still runs. `tokens`: the request's ids so far (prompt and output). The request's lock moves down
        to the node that ends its pages, and its block table takes the tree's blocks (a page another request
        inserted first replaces our duplicate, which the tree freed)."""
        if not self.enable_cache or kv.status is not Status.RUNNING:
            return
        self.load_layers(kv)  # no page reaches the tree before its every layer is in
        p = self.page_size
        full = kv.num_kv // p
        if full <= kv.tree_blocks:
            return
        full = min(full, self.admission_limit(kv))  # pages past the limit stay ours
        if full <= kv.tree_blocks:
            return
        cache, ns = self.cache, kv.namespace
        tokens = as_token_array(tokens[: full * p])  # converted once: the insert and the lock read it as it is
        cached = cache.insert(tokens, kv.block_table[:full], namespace=ns) // p
        self._adoptions.adopted(kv, tokens, cached, full)
        node = cache.lock_prefix(tokens, full * p, namespace=ns)
        assert node is not None, "the pages just inserted are in the tree, and locked"
        old, kv.match_node = kv.match_node, node
        if old is not None:
            cache.unlock(old)
        kv.block_table[kv.tree_blocks : full] = path_blocks(node, kv.tree_blocks * p, p)
        kv.tree_blocks = full
        self._adoptions.raise_fault()

    def admission_limit(self, kv: KVState, *, output_tokens: int | None = None) -> int:
        """Pages of a running request, counted from the root, that the tree may adopt. The admission policy is
        asked once per request and its answer kept (preemptions included); `output_tokens` given: the request has
        finished with that many, so its total is what it computed, not its most possible. A pin's pages are always
        adopted (a pin needs them in the tree)."""
        if kv.admit_limit is None:
            ask = kv.admission_request(self.page_size, output_tokens)
            try:
                pages = int(self.admission.admit(ask))
            except Exception as exc:  # a prediction must never fail a request or leak its pages: adopt them all
                if not self._policy_failed:
                    message = f"admission policy {self.admission.name!r} failed ({exc!r}); adopting every page"
                    warnings.warn(message, RuntimeWarning, stacklevel=2)
                    self._policy_failed = True
                pages = ask.total_pages
            kv.admit_limit = max(pages, kv.found_pages, kv.pin // self.page_size)
        return kv.admit_limit

    def prefetch(self, kv: KVState, tokens: Sequence[int]) -> bool:
        """Start reading a waiting request's disk pages ahead of its admission, off the loop (kv.tier.prefetch; the
        first call per wait), and say whether the prefetch policy lets `admit` take it now (always without a disk
        tier). `tokens` as `admit`'s. Raises only ValueError, holding nothing, for a namespace the page keys cannot
        name (radixcache.page_hash.namespace_key)."""
        tiers = self.tiers
        if tiers is None or tiers.reader is None or kv.status is not Status.WAITING:
            return True
        if kv.page_chain is None:
            kv.page_chain = tiers.chain(kv.namespace)
        return tiers.prefetch(kv.rid, tokens, kv.namespace, kv.page_chain)

    def peek(self, tokens: Sequence[int], namespace: Hashable) -> tuple[int, TreeNode | None]:
        """Cached tokens of `tokens` (whole pages) and the deepest node reached, changing nothing (for ordering)."""
        if not self.enable_cache:
            return 0, None
        match = self.cache.peek(tokens, namespace=namespace)
        return match.length, (match.node if match.length else None)

    # ------------------------------------------------------------------ pins

    def pin(self, kv: KVState, tokens: Sequence[int], made_for: Sequence[int] | None = None) -> int:
        """Pin the first `kv.pin` tokens of `tokens` once the request's prompt is computed and committed: exactly
        the whole pages they fill, for the prompt `made_for` that `unpin` names (None: the request's prompt).
        Returns the tokens pinned (0: nothing asked, or refused past the pinned share)."""
        if not self.enable_cache or not kv.pin or kv.status is not Status.RUNNING:
            return 0
        n = min(kv.pin, kv.tree_blocks * self.page_size) // self.page_size * self.page_size
        made_for = tokens[: kv.prompt_tokens] if made_for is None else made_for
        return self.pins.pin(list(tokens[:n]), kv.namespace, made_for, kv.pin_holder) if n else 0

    # ------------------------------------------------------------------ leaving

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

    # ------------------------------------------------------------------ private

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

    def _unlock_all(self, node: TreeNode | None, host_hashes: list[bytes]) -> None:
        if node is not None:
            self.cache.unlock(node)
        if host_hashes and self.tiers is not None:
            self.tiers.unlock_host(host_hashes)

    def _unlock(self, kv: KVState) -> None:
        node, kv.match_node = kv.match_node, None
        if node is not None:
            self.cache.unlock(node)
