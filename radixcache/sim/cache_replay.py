"""The replay through one RadixCache (`CacheReplay`), with an eviction policy or an offline oracle, and admission.

Each request, in arrival order: match its prompt, lock the match, allocate blocks for the rest of prompt plus
recorded output (evicting as the policy says), and, when it finishes, insert and unlock. With `concurrency` N,
up to N requests are in flight: when admitting a request would make N+1, the oldest in flight finishes
first (requests finish in arrival order; the trace has no durations). In-flight requests keep their matched
path locked and their new blocks held, so they press on the cache exactly as running requests do; their new
prompt blocks become shareable when they finish. Concurrency 1 is plain sequential replay.

A prompt is matched in full (no token is held back for logits), so the infinite-cache hit rate equals the
count of prefix blocks seen before. A request larger than the whole cache caches what fits.
"""

from __future__ import annotations

import time
from dataclasses import replace

from radixcache.cache import RadixCache
from radixcache.errors import RadixCacheError
from radixcache.policy.admission import AdmissionPolicy, AdmissionRequest, make_admission
from radixcache.policy.base import EvictionPolicy
from radixcache.policy.registry import make_policy
from radixcache.sim.belady import BeladyPolicy
from radixcache.sim.oracle import ChainedNextUseOracle, DeadBlockLRU, NextUseOracle
from radixcache.sim.replay_common import (
    OneCacheReplay,
    Replayable,
    advance_to_arrival,
    finish_into_tree,
    fit_request,
    holds_engine_tail,
    prompt_blocks,
    prompt_commits,
    replay_figures,
    request_tokens,
    shared_early,
)
from radixcache.sim.results import BELADY_ADMISSION, DEAD_LRU, ORACLE_POLICIES, SimResult
from radixcache.trace.workload import SimRequest


class CacheReplay(OneCacheReplay):
    """One replay through a RadixCache, fed request by request (`feed`), then `close`d and read (`result`).

    The admission bound (BELADY_ADMISSION) runs a cache with room for the requests in flight on top of
    `capacity_blocks`, and after each request finishes evicts, in Belady's order, whatever the tree holds beyond
    `capacity_blocks`: a request's own pages are then cached only if they beat what is there.
    """

    def __init__(
        self,
        workload: Replayable,
        capacity_blocks: int,
        policy: str | EvictionPolicy = "lru",
        *,
        concurrency: int = 1,
        check: bool = False,
        windows: int = 20,
        admission: str | AdmissionPolicy | None = None,
        honor_timestamps: bool = False,
        prefill_chunk: int | None = None,
    ) -> None:
        if prefill_chunk is not None and (type(prefill_chunk) is not int or prefill_chunk < 1):
            raise RadixCacheError(f"prefill_chunk must be a positive int of tokens or None, got {prefill_chunk!r}")
        self.prefill_chunk = prefill_chunk
        if type(concurrency) is not int or concurrency < 1:
            raise RadixCacheError(f"concurrency must be a positive int, got {concurrency!r}")
        # Checked here, not only by the RadixCache: the admission bound's tree is larger than the capacity (0 ran a
        # replay that cached nothing), and the oracles read it first ("5" was a TypeError from inside them).
        if type(capacity_blocks) is not int or capacity_blocks < 1:
            raise RadixCacheError(f"capacity_blocks must be a positive int, got {capacity_blocks!r}")
        self.oracle = None
        self.bound: int | None = None  # the admission bound's limit on what stays cached between requests
        room = capacity_blocks
        if policy in ORACLE_POLICIES:
            if admission is not None:
                raise RadixCacheError(f"{policy} is an offline bound: it takes no admission policy")
            self.oracle = ChainedNextUseOracle.build(workload, capacity_blocks) or NextUseOracle(
                workload, capacity_blocks
            )
            if policy == BELADY_ADMISSION:
                self.bound = capacity_blocks
                room = capacity_blocks + concurrency * _largest_request_pages(workload)
                self.oracle.hold_blocks(room)
            oracle = self.oracle
            policy = (
                BeladyPolicy(oracle.next_use, oracle.next_use_of_block) if policy != DEAD_LRU else DeadBlockLRU(oracle)
            )
        self.cache = RadixCache(room, page_size=workload.page_size, policy=make_policy(policy))
        self.admission = None if admission is None else make_admission(admission, eviction=self.cache.policy)
        self.expect = getattr(self.cache.policy, "expect", None)  # a policy that learns from output lengths
        self.declined_pages = 0
        super().__init__(workload, capacity_blocks, concurrency, check, windows, honor_timestamps)

    def feed(self, index: int, request: SimRequest) -> None:
        started = time.perf_counter()
        cache, oracle, p = self.cache, self.oracle, self.cache.page_size
        if self.bound is not None:
            # The admission bound trims the tree to `bound` as a request finishes, before the oracle's clock moves
            # on to this request: this request's own reads must count as next uses.
            for item in self.inflight.due(request.timestamp_ms):
                self._complete(item)
        if oracle is not None:
            oracle.now = index
        for item in self.inflight.due(request.timestamp_ms):
            self._complete(item)
        if self.honor_timestamps:
            advance_to_arrival(cache, request)
        full, prompt = request_tokens(request)
        match = cache.match_prefix(prompt, namespace=request.namespace)
        cache.lock(match.node)
        matched_pages = len(match.blocks)
        hit = min(match.length * request.unit, request.prompt_tokens)
        full, need, room, cut = fit_request(cache, full, matched_pages)
        self.oversized += cut
        # A request an engine recorded also held, while it ran, the page it was still writing (if its written tokens
        # do not end on a page boundary): one block more, which never enters the tree (SimRequest.holds_tail).
        tail = holds_engine_tail(request, full, p) and need < room
        need += tail
        if oracle is not None and need > cache.free_blocks:
            # Evicted ahead of the allocation: the cache takes an oracle policy's blocks one at a time (it ranks
            # leaves by extent), re-ranking the leaf by its new deepest block after each.
            cache.evict(need - cache.free_blocks)
        new = cache.allocate(need)
        if oracle is not None:
            oracle.assign(new, index, matched_pages)
        output_tokens = request.output_tokens if request.output_tokens is not None else len(request.output)
        held = new[-1:] if tail else []  # the engine's partial page: held while in flight, never adopted
        if tail:
            new = new[:-1]
        blocks = match.blocks + new
        node = match.node
        early = shared_early(request, len(full) // p, p) if self.admission is None else 0
        # With the engine's commits modelled, its decode gave the tree each page past these as it filled it.
        decoded = early if self.prefill_chunk is not None else 0
        if early > matched_pages:  # its prompt's pages go into the tree now, pinned until it finishes
            for pages in prompt_commits(request, matched_pages, early, p, self.prefill_chunk):
                cache.insert(full[: pages * p], blocks[:pages], namespace=request.namespace)
            pinned = cache.lock_prefix(full, early * p, namespace=request.namespace)  # all cached: never None
            if pinned is not None:
                cache.unlock(match.node)
                node = pinned
        self.inflight.add(
            (node, full, blocks, request.namespace, matched_pages, len(prompt) // p, output_tokens, held, decoded),
            request.finish_ms,
        )
        self.prompt_blocks += prompt_blocks(request, p)
        self.hit_blocks += matched_pages
        self.timeline.add(request.timestamp_ms, request.prompt_tokens, hit)
        if self.check:
            cache.check_invariants()
        self.seconds += time.perf_counter() - started

    def _complete(self, item: tuple) -> None:
        """A request finishes: the tree adopts its pages (as many as admission allows) and it unlocks its match."""
        node, full, blocks, namespace, matched, prompt_pages, output_tokens, held, decoded = item
        cache, p = self.cache, self.cache.page_size
        if held:
            cache.free(held)
        if decoded:  # each page the decode filled, one insert apiece, before its output length is known
            for pages in range(decoded + 1, len(full) // p + 1):
                cache.insert(full[: pages * p], blocks[:pages], namespace=namespace)
        if self.expect is not None:  # said before its insert, and taken back after it (below)
            self.expect(output_tokens)
        pages = len(full) // p
        keep = pages
        if self.admission is not None:
            keep = self.admission.admit(
                AdmissionRequest(namespace, matched, prompt_pages, pages, None, None, output_tokens)
            )
        if keep < pages:
            self.declined_pages += pages - keep
            if keep:
                cache.insert(full[: keep * p], blocks[:keep], namespace=namespace)
            cache.free(blocks[keep:])
            cache.unlock(node)
        else:
            finish_into_tree(cache, (node, full, blocks, namespace), p)
        if self.expect is not None:
            # An insert that made no new leaf (every page cached, as for a recorded request whose prompt went in at its
            # start and whose output filled no page) left it unread: the next leaf, another request's, took it.
            self.expect(None)
        if self.bound is not None:  # the admission bound: only `bound` blocks stay between requests
            excess = cache.cached_tokens // p - self.bound
            if excess > 0:
                cache.evict(excess)

    def close(self) -> None:
        for item in self.inflight.drain():
            self._complete(item)
        if self.check:
            self.cache.check_invariants()

    def result(self) -> SimResult:
        name = BELADY_ADMISSION if self.bound is not None else self.cache.policy.name
        evicted = self.cache.stats.evicted_blocks
        base = replay_figures(self, name, self.capacity_blocks, evicted, self.oversized)
        admission = self.admission.name if self.admission is not None else None
        return replace(base, admission=admission, declined_pages=self.declined_pages)


def _largest_request_pages(workload: Replayable) -> int:
    """The most pages one request of `workload` inserts (prompt and output): the room one in flight needs."""
    p = workload.page_size
    return max((-(-(len(r.prompt) + len(r.output)) // p) for r in workload), default=1)
