"""Matching and locking: the layer of `KVManager` (kv.manager) that admits a request and grows its block table.

`admit` matches a request's ids so far (the device tree, then the host and disk tiers), locks the match, plans and
starts the tier loads, and allocates its pages up to a position, evicting (and asking the oldest leases to give way)
if needed; `reserve` grows a running request's table by a page for its next token; `load_layers` finishes a
deferred disk load layer by layer. `prefetch`, `peek` and `mark_retention` look ahead for a waiting request.

Invariants: `admit` either leaves the request RUNNING, holding its lock (on the tree node and any host pages it
loads from) and blocks, or, when it returns False or raises, holding nothing; at most all of a request's tokens but
the last count as cached (kv.manager's "The last token").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from radixcache import RadixCache, TreeNode
from radixcache.runtime.kv.leases import LeaseTable
from radixcache.runtime.kv.retention import RetentionPolicy
from radixcache.runtime.kv.state import KVState, Status

if TYPE_CHECKING:
    from radixcache.runtime.kv.events import KVEventLog
    from radixcache.runtime.kv.tier.coordinator import KVTiers


class Matching:
    """`admit`, `reserve`, `load_layers`, `prefetch`, `peek` and `mark_retention`: a request's pages in."""

    cache: RadixCache  # (set in KVManager.__init__)
    page_size: int
    enable_cache: bool
    tiers: KVTiers | None
    events: KVEventLog | None
    retention: RetentionPolicy | None
    leases: LeaseTable
    copy_page: Callable[[int, int], None] | None

    def pages(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

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
                node, last_page = self._lock_shorter(node, tokens, len(blocks), kv.namespace), None
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
                # Copied, the tree's page is not read again: it leaves our lock, as an uncopied one does. Held, it
                # stayed locked until the request's next commit (for its whole life without in-flight sharing), a
                # page of the pool it could not grow into: a repeat that fit a nearly full pool ended with "length".
                node = self._lock_shorter(node, tokens, len(blocks), kv.namespace)
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

    def _lock_shorter(
        self, node: TreeNode | None, tokens: Sequence[int], pages: int, namespace: Hashable
    ) -> TreeNode | None:
        """Move a lock from `node` up to the node that ends the first `pages` pages of `tokens` (None: no page)."""
        short = self.cache.lock_prefix(tokens, pages * self.page_size, namespace=namespace) if pages else None
        self._unlock_all(node, [])
        return short

    def _unlock_all(self, node: TreeNode | None, host_hashes: list[bytes]) -> None:
        if node is not None:
            self.cache.unlock(node)
        if host_hashes and self.tiers is not None:
            self.tiers.unlock_host(host_hashes)
