"""The engine's only door to the radix cache: a request's KV pages from admission to release.

match and lock -> allocate -> commit each computed chunk (in flight) -> grow while decoding -> release.

Every method leaves the cache's invariants true, also when it raises: a request either holds its lock and blocks
(RUNNING) or holds nothing (WAITING, FINISHED, ABORTED).

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
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from enum import Enum
from typing import TYPE_CHECKING

from radixcache import RadixCache, TreeNode
from radixcache.policy.admission import AdmissionPolicy, AdmissionRequest, make_admission
from radixcache.runtime.kv.pins import PinTable
from radixcache.runtime.kv.retention import RetentionPolicy

if TYPE_CHECKING:
    from radixcache.runtime.engine.request import Request
    from radixcache.runtime.kv.events import KVEventLog
    from radixcache.runtime.kv.tier.coordinator import KVTiers


class Status(Enum):
    """Where a request's KV is: the state names what it holds."""

    WAITING = "waiting"  # not yet admitted (or preempted): holds no blocks
    RUNNING = "running"  # admitted: holds a lock and blocks
    FINISHED = "finished"  # released: its KV went to the tree (or was freed)
    ABORTED = "aborted"  # released after an error


class KVManager:
    """Admission, growth, in-flight commits, pins and release of requests' pages in one RadixCache.

    With `enable_cache=False` it allocates and frees blocks the same way but never matches, commits or inserts,
    so nothing is reused (the baseline). `max_pinned_blocks`: the most pages pins may lock (kv.pins).
    `admission`: how much of each request the tree adopts (a name in radixcache.policy.admission.ADMISSION_POLICIES, a
    policy, or None for "all"); `declined_pages` counts the computed full pages it declined (freed instead).
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
    ) -> None:
        self.cache = cache
        self.tiers = tiers if enable_cache else None
        self.events = events if enable_cache else None  # stored/removed page keys for a router (kv.events)
        self.enable_cache = enable_cache
        self.page_size = cache.page_size
        self.retention = retention
        self.pins = PinTable(cache, max_pinned_blocks)
        self.admission = make_admission(admission, eviction=cache.policy)
        self.declined_pages = 0  # computed full pages the admission policy kept out of the tree (freed)
        self._policy_failed = False  # warned once already

    def pages(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    # ------------------------------------------------------------------ admission

    def admit(self, req: Request, *, reserve: int = 0, strict: bool = True) -> bool:
        """Match what the request needs (a fresh prompt less its last token; a resumed request's tokens but the
        last), lock the match, and allocate pages up to `req.prefill_end`, evicting if needed.

        `reserve`: pages that must stay free or evictable afterwards (headroom for running decodes). When the
        pages are not there: with `strict`, raise CacheFullError; otherwise return False. Either way nothing
        is held then.
        """
        if req.status is not Status.WAITING:
            raise RuntimeError(f"request {req.rid} is {req.status.value}, not waiting")
        cache = self.cache
        end = req.prefill_end
        resumed = bool(req.output_ids)
        blocks: Sequence[int] = ()
        node = None
        tiers, tier_match = self.tiers, None
        host_hashes: list[bytes] = []
        disk_pages = 0
        if self.enable_cache:
            query = req.all_ids[: end if resumed else end - 1]
            if req.page_chain is None and (tiers is not None or self.events is not None):
                req.page_chain = (tiers or self.events).chain(req.namespace)  # type: ignore[union-attr]
            if tiers is not None:
                tier_match = tiers.match(query, req.namespace, req.page_chain)
                match = tier_match.device
            else:
                match = cache.match_prefix(query, namespace=req.namespace)
            node, blocks = match.node, match.blocks
            cache.lock(node)
            if tier_match is not None:
                assert tiers is not None
                host_pages, disk_pages = tiers.plan(tier_match)
                host_hashes = tiers.lock_host(tier_match, host_pages)
        try:
            need = self.pages(end) - len(blocks)
            if not strict and need + reserve > cache.free_blocks + cache.evictable_blocks:
                self._unlock_all(node, host_hashes)
                return False
            new = cache.allocate(need)
        except BaseException:
            self._unlock_all(node, host_hashes)
            raise
        loaded = 0
        if tier_match is not None:
            assert tiers is not None
            try:  # unlocks the host pages whatever happens
                loaded = tiers.load(tier_match, host_hashes, disk_pages, query, new)
            except BaseException:
                cache.free(new)
                self._unlock_all(node, [])
                raise
        p = self.page_size
        matched = (len(blocks) + loaded) * p
        req.match_node = node
        req.tree_blocks = len(blocks)
        req.block_table = [*blocks, *new]  # a list: the table grows and its tree part is rewritten in place
        req.num_kv = matched
        if req.preemptions == 0 and not resumed and req.t_admitted is None:
            req.cached_tokens = matched if req.cached_cap is None else min(matched, req.cached_cap)
            req.found_pages = len(blocks) + loaded
            if tiers is not None:
                host_loaded = min(loaded, len(host_hashes))
                tiers.count_hits(len(blocks) * p, host_loaded * p, (loaded - host_loaded) * p)
        else:  # a resumption: what it computes again is recomputation, not a miss, and its hits are not hits
            req.recomputed_tokens += max(0, req.computed_max - matched)
        req.status = Status.RUNNING
        return True

    def reserve(self, req: Request, num_tokens: int) -> None:
        """Make the block table cover `num_tokens` positions, allocating new pages (evicting if needed)."""
        missing = self.pages(num_tokens) - len(req.block_table)
        if missing > 0:
            req.block_table.extend(self.cache.allocate(missing))

    def mark_retention(self, req: Request) -> None:
        """Give the request's prompt its retention priority (kv.retention), if it asked for one."""
        if req.retention and self.enable_cache and self.retention is not None:
            self.retention.mark(req.namespace, req.prompt_ids, req.retention)

    # ------------------------------------------------------------------ sharing while running

    def commit(self, req: Request) -> None:
        """Give the tree the request's computed full pages now (in flight), so that other requests hit them while
        this one still runs. The request's lock moves down to the node that ends its pages, and its block table
        takes the tree's blocks (a page another request inserted first replaces our duplicate, which the tree
        freed)."""
        if not self.enable_cache or req.status is not Status.RUNNING:
            return
        p = self.page_size
        full = req.num_kv // p
        if full <= req.tree_blocks:
            return
        full = min(full, self.admission_limit(req))  # pages past the limit stay ours
        if full <= req.tree_blocks:
            return
        cache, ns = self.cache, req.namespace
        tokens = req.all_ids[: full * p]
        cached = cache.insert(tokens, req.block_table[:full], namespace=ns) // p
        self._adopted(req, tokens, cached, full)
        node = cache.lock_prefix(tokens, full * p, namespace=ns)
        assert node is not None, "the pages just inserted are in the tree, and locked"
        old, req.match_node = req.match_node, node
        if old is not None:
            cache.unlock(old)
        req.block_table[req.tree_blocks : full] = _blocks_between(node, req.tree_blocks * p, p)
        req.tree_blocks = full

    def admission_limit(self, req: Request, *, final: bool = False) -> int:
        """Pages of a running request, counted from the root, that the tree may adopt. The admission policy is
        asked once per request and its answer kept (preemptions included); `final`: the request has finished, so
        its total (and its output length) is what it computed, not its most possible. A pin's pages are always
        adopted (a pin needs them in the tree)."""
        if req.admit_limit is None:
            p = self.page_size
            computed = req.num_kv // p
            most = (len(req.prompt_ids) + req.params.max_new_tokens - 1) // p  # the last token's K/V never exists
            total = computed if final else max(computed, most)
            ask = AdmissionRequest(
                namespace=req.namespace,
                cached_pages=req.found_pages,
                prompt_pages=len(req.prompt_ids) // p,
                total_pages=total,
                retain=req.retain,
                timestamp=req.t_arrival * 1000.0,  # ms, on the engine's perf_counter clock
                output_tokens=len(req.output_ids) if final else None,  # known only once it finished
            )
            try:
                pages = int(self.admission.admit(ask))
            except Exception as exc:  # a prediction must never fail a request or leak its pages: adopt them all
                if not self._policy_failed:
                    message = f"admission policy {self.admission.name!r} failed ({exc!r}); adopting every page"
                    warnings.warn(message, RuntimeWarning, stacklevel=2)
                    self._policy_failed = True
                pages = total
            req.admit_limit = max(pages, req.found_pages, req.pin // p)
        return req.admit_limit

    def peek(self, tokens: Sequence[int], namespace: Hashable) -> tuple[int, TreeNode | None]:
        """Cached tokens of `tokens` (whole pages) and the deepest node reached, changing nothing (for ordering)."""
        if not self.enable_cache:
            return 0, None
        match = self.cache.peek(tokens, namespace=namespace)
        return match.length, (match.node if match.length else None)

    # ------------------------------------------------------------------ pins

    def pin(self, req: Request) -> int:
        """Pin the first `req.pin` tokens of a request whose prompt is computed and committed: exactly the whole
        pages they fill. Returns the tokens pinned (0: nothing asked, or refused past the pinned share)."""
        if not self.enable_cache or not req.pin or req.status is not Status.RUNNING:
            return 0
        n = min(req.pin, req.tree_blocks * self.page_size) // self.page_size * self.page_size
        return self.pins.pin(req.all_ids[:n], req.namespace) if n else 0

    # ------------------------------------------------------------------ leaving

    def release(self, req: Request) -> None:
        """A finished request: give its computed KV to the tree (positions `< num_kv`), unlock its match and
        free what the tree did not take (the unaligned tail page and any unused page)."""
        if req.status is not Status.RUNNING:
            raise RuntimeError(f"request {req.rid} is {req.status.value}, not running")
        self._give_back(req, final=True)
        req.status = Status.FINISHED

    def preempt(self, req: Request) -> None:
        """Take a running request's blocks back: its computed KV goes to the tree (evictable), everything else
        is freed, and it waits again to be resumed."""
        if req.status is not Status.RUNNING:
            raise RuntimeError(f"request {req.rid} is {req.status.value}, not running")
        req.computed_max = max(req.computed_max, req.num_kv)
        self._give_back(req, final=False)
        req.num_kv = 0
        req.preemptions += 1
        req.status = Status.WAITING

    def abort(self, req: Request, *, status: Status = Status.ABORTED) -> None:
        """Free every block the request holds and drop its lock. Safe to call in any state. Pages it already
        committed stay in the tree (their KV is complete: a pass that failed committed nothing)."""
        if req.status is Status.RUNNING:
            held = req.held_blocks
            del req.block_table[req.tree_blocks :]
            if held:
                self.cache.free(held)
            req.block_table = []
            req.tree_blocks = 0
            self._unlock(req)
        req.status = status

    # ------------------------------------------------------------------ private

    def _give_back(self, req: Request, *, final: bool) -> None:
        """Insert the request's computed KV up to its admission limit, free everything else, unlock."""
        if not self.enable_cache:
            self.abort(req, status=Status.RUNNING)
            return
        cache, p = self.cache, self.page_size
        used = self.pages(req.num_kv)
        spare = req.block_table[used:]
        if spare:
            cache.free(spare)
            del req.block_table[used:]
        full = req.num_kv // p
        keep = full  # pages the tree adopts (or has): never fewer than it already has of ours
        if full > req.tree_blocks:
            keep = max(req.tree_blocks, min(full, self.admission_limit(req, final=final)))
        # Every page is offered (the tail page too, which the tree leaves to us) unless some are declined.
        n = req.num_kv if keep == full else keep * p
        if n:
            tokens = req.all_ids[:n]
            _expect_output(cache.policy, len(req.output_ids) if final else None)
            cached = cache.insert(tokens, req.block_table[: self.pages(n)], namespace=req.namespace) // p
            _expect_output(cache.policy, None)  # spent, or unused when every page was in the tree already
            self._adopted(req, tokens, cached, keep)
        # The tree now owns the first `keep` pages (duplicates of cached pages went back to the free pool); the
        # declined pages and an unaligned tail page are still ours.
        mine = req.block_table[keep:]
        self.declined_pages += full - keep
        req.block_table = []
        req.tree_blocks = 0
        if mine:
            cache.free(mine)
        self._unlock(req)

    def _adopted(self, req: Request, tokens: list[int], first: int, last: int) -> None:
        """The tree just adopted the request's pages `first .. last` (its own blocks): they go down the tiers, and
        their keys to the event log."""
        chain = req.page_chain
        if last <= first or chain is None:
            return
        if self.tiers is not None:
            self.tiers.adopted(chain, tokens, first, last, req.block_table[first:last])
        if self.events is not None:
            self.events.stored(chain.upto(tokens, last)[first:last])

    def _unlock_all(self, node: TreeNode | None, host_hashes: list[bytes]) -> None:
        if node is not None:
            self.cache.unlock(node)
        if host_hashes and self.tiers is not None:
            self.tiers.unlock_host(host_hashes)

    def _unlock(self, req: Request) -> None:
        node, req.match_node = req.match_node, None
        if node is not None:
            self.cache.unlock(node)


def _blocks_between(node: TreeNode, start: int, page_size: int) -> list[int]:
    """The tree's blocks for positions `start .. node.end_len` of the path ending at `node`, read upwards (only
    the nodes of the newly committed span are visited, never the whole path from the root)."""
    parts: list[list[int]] = []
    n: TreeNode | None = node
    while n is not None and n.parent is not None and n.end_len > start:
        skip = max(0, start - n.prefix_len) // page_size
        parts.append(n.blocks[skip:])
        n = n.parent
    return [b for part in reversed(parts) for b in part]


def _expect_output(policy: object, output_tokens: int | None) -> None:
    """Tell a policy that learns from output lengths (radixcache.policy.reuse, possibly behind the retention
    wrapper's `base`) what the request about to insert generated; the simulator does the same for a trace."""
    while policy is not None and not hasattr(policy, "expect"):
        policy = getattr(policy, "base", None)
    if policy is not None:
        policy.expect(output_tokens)  # type: ignore[attr-defined]
