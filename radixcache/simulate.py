"""Replay a trace through `RadixCache` (no model) at a capacity, a page size and a policy, and report hit rates.

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
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from radixcache.cache import RadixCache
from radixcache.errors import RadixCacheError
from radixcache.policies import BeladyPolicy, EvictionPolicy, make_policy
from radixcache.simulate_oracle import DeadBlockLRU, NextUseOracle
from radixcache.simulate_workload import Workload

if TYPE_CHECKING:
    from radixcache.simulate_source import TraceSource

#: what `simulate` replays: requests in memory, or a trace file streamed (radixcache.simulate_source)
Replayable = Union[Workload, "TraceSource"]

BELADY = "belady"
DEAD_LRU = "lru-dead"  # LRU that knows which blocks are never read again: a diagnostic bound
ORACLE_POLICIES = (BELADY, DEAD_LRU)


@dataclass(frozen=True, slots=True)
class Window:
    """Requests that arrived in [start_ms, end_ms), and what they hit."""

    start_ms: float
    end_ms: float
    requests: int
    prompt_tokens: int
    hit_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True, slots=True)
class SimResult:
    """One replay. Tokens are real prompt tokens; blocks are cache blocks (pages, or trace hash blocks)."""

    policy: str
    capacity_blocks: int
    page_size: int
    block_tokens: int
    concurrency: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    prompt_blocks: int
    hit_blocks: int
    evicted_blocks: int
    oversized_requests: int  # requests that needed more blocks than the cache could free; cached in part
    windows: tuple[Window, ...]
    seconds: float

    @property
    def hit_rate(self) -> float:
        """Hit tokens over prompt tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        """Hit blocks over prompt blocks (a prompt's partial last page counts as a block that can miss)."""
        return self.hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0


@dataclass(frozen=True, slots=True)
class SimReport:
    """A replay with its bounds: the same trace through an infinite cache, and through Belady's optimum."""

    result: SimResult
    infinite: SimResult
    belady: SimResult | None = None

    def as_dict(self) -> dict:
        """The machine-readable summary (the keys of `radixcache simulate --json`)."""
        r = self.result
        out = {
            "policy": r.policy,
            "capacity_blocks": r.capacity_blocks,
            "block_tokens": r.block_tokens,
            "concurrency": r.concurrency,
            "requests": r.requests,
            "prompt_tokens": r.prompt_tokens,
            "hit_tokens": r.hit_tokens,
            "hit_rate": r.hit_rate,
            "block_hit_rate": r.block_hit_rate,
            "evicted_blocks": r.evicted_blocks,
            "oversized_requests": r.oversized_requests,
            "infinite_hit_rate": self.infinite.hit_rate,
            "infinite_block_hit_rate": self.infinite.block_hit_rate,
            "windows": [
                {"start_ms": w.start_ms, "end_ms": w.end_ms, "requests": w.requests, "hit_rate": w.hit_rate}
                for w in r.windows
            ],
            "seconds": r.seconds,
        }
        if self.belady is not None:
            out["belady_hit_rate"] = self.belady.hit_rate
            out["belady_block_hit_rate"] = self.belady.block_hit_rate
        return out


def simulate(
    workload: Replayable,
    capacity_blocks: int,
    policy: str | EvictionPolicy = "lru",
    *,
    concurrency: int = 1,
    windows: int = 20,
    progress: Callable[[int], None] | None = None,
    check: bool = False,
) -> SimResult:
    """Replay `workload` (an in-memory Workload, or a streamed TraceSource read once) through a cache of
    `capacity_blocks` blocks at `policy`. Memory is the cache's plus 24 bytes per request for the time windows.

    `policy` may also name an offline oracle: "belady" (the optimum) or "lru-dead" (LRU that knows which
    blocks are never read again), both evicting block by block; they read the trace once more first.

    `progress(n)` is called now and then with the number of requests replayed since its last call. `check`
    runs the cache's full invariant check after every request (slow: for tests).
    """
    if type(concurrency) is not int or concurrency < 1:
        raise RadixCacheError(f"concurrency must be a positive int, got {concurrency!r}")
    if type(windows) is not int or windows < 1:
        raise RadixCacheError(f"windows must be a positive int, got {windows!r}")
    oracle = None
    if policy in ORACLE_POLICIES:
        oracle = NextUseOracle(workload, capacity_blocks)
        policy = BeladyPolicy(oracle.next_use) if policy == BELADY else DeadBlockLRU(oracle)
    cache = RadixCache(capacity_blocks, page_size=workload.page_size, policy=make_policy(policy))
    started = time.perf_counter()
    p = workload.page_size
    timeline = _Timeline()
    inflight: deque = deque()
    prompt_blocks = hit_blocks = oversized = 0

    for index, request in enumerate(workload):
        if oracle is not None:
            oracle.now = index
        while len(inflight) >= concurrency:
            _finish(cache, inflight.popleft(), p)
        match = cache.match_prefix(request.prompt, namespace=request.namespace)
        cache.lock(match.node)
        matched_pages = len(match.blocks)
        hit = min(match.length * request.unit, request.prompt_tokens)
        full = request.prompt + request.output if request.output else request.prompt
        need = -(-len(full) // p) - matched_pages
        room = cache.free_blocks + cache.evictable_blocks
        if need > room:  # larger than what the cache can free: cache the whole pages that fit
            oversized += 1
            need = room
            full = full[: (matched_pages + room) * p]
        if oracle is not None:
            # One block at a time, so the leaf is re-ranked by its new deepest block after each: the cache
            # takes several blocks from one leaf in a single step, which is exact only when every block of a
            # leaf shares the leaf's priority (LRU and the like), not for an oracle's per-block next use.
            short = need - cache.free_blocks
            while short > 0:
                short -= cache.evict(1)
        new = cache.allocate(need)
        if oracle is not None:
            oracle.assign(new, index, matched_pages)
        inflight.append((match.node, full, match.blocks + new, request.namespace))

        prompt_blocks += -(-len(request.prompt) // p)
        hit_blocks += matched_pages
        timeline.add(request.timestamp_ms, request.prompt_tokens, hit)
        if check:
            cache.check_invariants()
        if progress is not None and index % 256 == 255:
            progress(256)
    while inflight:
        _finish(cache, inflight.popleft(), p)
    if check:
        cache.check_invariants()
    if progress is not None and timeline.requests % 256:
        progress(timeline.requests % 256)

    return SimResult(
        policy=cache.policy.name,
        capacity_blocks=capacity_blocks,
        page_size=p,
        block_tokens=workload.block_tokens,
        concurrency=concurrency,
        requests=timeline.requests,
        prompt_tokens=timeline.prompt_tokens,
        hit_tokens=timeline.hit_tokens,
        prompt_blocks=prompt_blocks,
        hit_blocks=hit_blocks,
        evicted_blocks=cache.stats.evicted_blocks,
        oversized_requests=oversized,
        windows=timeline.windows(windows),
        seconds=time.perf_counter() - started,
    )


def simulate_infinite(
    workload: Replayable,
    *,
    concurrency: int = 1,
    windows: int = 20,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """The replay through a cache that never evicts, without building one: a set of every inserted page's chained
    key (a hash of the page and its parent's key, so a page is its whole prefix). The same figures as `simulate`
    at a capacity nothing fills, in the memory of one integer per distinct page. `capacity_blocks` of the result
    is the number of distinct pages inserted: what an infinite cache ends up holding.

    Chained keys are 64-bit hashes: two different prefixes share one with probability about n^2 / 2^64 for n
    distinct pages (below 1e-6 for 5 million pages)."""
    if type(concurrency) is not int or concurrency < 1:
        raise RadixCacheError(f"concurrency must be a positive int, got {concurrency!r}")
    started = time.perf_counter()
    p = workload.page_size
    seen: set[int] = set()
    timeline = _Timeline()
    inflight: deque = deque()
    prompt_blocks = hit_blocks = 0
    for index, request in enumerate(workload):
        while len(inflight) >= concurrency:
            seen.update(inflight.popleft())
        root = hash(("namespace", request.namespace))
        full = request.prompt + request.output if request.output else request.prompt
        keys = _chain_keys(root, full, p)
        prompt_pages = len(request.prompt) // p
        matched = 0
        while matched < prompt_pages and keys[matched] in seen:
            matched += 1
        inflight.append(keys)
        prompt_blocks += -(-len(request.prompt) // p)
        hit_blocks += matched
        timeline.add(
            request.timestamp_ms, request.prompt_tokens, min(matched * p * request.unit, request.prompt_tokens)
        )
        if progress is not None and index % 256 == 255:
            progress(256)
    while inflight:
        seen.update(inflight.popleft())
    if progress is not None and timeline.requests % 256:
        progress(timeline.requests % 256)
    return SimResult(
        policy="lru",
        capacity_blocks=max(1, len(seen)),
        page_size=p,
        block_tokens=workload.block_tokens,
        concurrency=concurrency,
        requests=timeline.requests,
        prompt_tokens=timeline.prompt_tokens,
        hit_tokens=timeline.hit_tokens,
        prompt_blocks=prompt_blocks,
        hit_blocks=hit_blocks,
        evicted_blocks=0,
        oversized_requests=0,
        windows=timeline.windows(windows),
        seconds=time.perf_counter() - started,
    )


def _chain_keys(root: int, tokens: tuple[int, ...], p: int) -> list[int]:
    """The chained key of each full page of `tokens`."""
    keys = []
    key = root
    if p == 1:
        for token in tokens:
            key = hash((key, token))
            keys.append(key)
    else:
        for k in range(len(tokens) // p):
            key = hash((key, tokens[k * p : (k + 1) * p]))
            keys.append(key)
    return keys


class _Timeline:
    """Per-request arrival time, prompt tokens and hit tokens in flat arrays (24 bytes a request), so that time
    windows can be cut once the whole trace has streamed by."""

    def __init__(self) -> None:
        self.times = array("d")
        self.prompts = array("q")
        self.hits = array("q")
        self.prompt_tokens = self.hit_tokens = 0

    @property
    def requests(self) -> int:
        return len(self.times)

    def add(self, timestamp_ms: float, prompt_tokens: int, hit_tokens: int) -> None:
        self.times.append(timestamp_ms)
        self.prompts.append(prompt_tokens)
        self.hits.append(hit_tokens)
        self.prompt_tokens += prompt_tokens
        self.hit_tokens += hit_tokens

    def windows(self, count: int) -> tuple[Window, ...]:
        """`count` windows of equal length from the first arrival to the last."""
        times = self.times
        t0 = times[0] if times else 0.0
        span = (times[-1] - t0) if times else 0.0
        width = span / count if span > 0 else 1.0
        requests = [0] * count
        prompt = [0] * count
        hit = [0] * count
        for t, n, h in zip(times, self.prompts, self.hits, strict=True):
            w = min(int((t - t0) / width), count - 1)
            requests[w] += 1
            prompt[w] += n
            hit[w] += h
        return tuple(Window(t0 + i * width, t0 + (i + 1) * width, requests[i], prompt[i], hit[i]) for i in range(count))


def _finish(cache: RadixCache, item: tuple, p: int) -> None:
    node, full, blocks, namespace = item
    cache.insert(full, blocks, namespace=namespace)
    if len(full) % p:
        cache.free(blocks[-1:])  # the unaligned tail page never enters the tree
    cache.unlock(node)


def infinite_capacity(workload: Workload) -> int:
    """A capacity no replay of an in-memory `workload` can fill, so nothing is ever evicted."""
    return max(1, workload.total_pages)


def evaluate(
    workload: Replayable,
    capacity_blocks: int,
    policy: str | EvictionPolicy = "lru",
    *,
    concurrency: int = 1,
    belady: bool = False,
    windows: int = 20,
    progress: Callable[[int], None] | None = None,
) -> SimReport:
    """`simulate` plus its bounds: the infinite-cache replay, and Belady's when asked for. A streamed workload
    is read once per replay (twice for Belady: its oracle reads the trace first)."""
    kwargs = {"concurrency": concurrency, "windows": windows, "progress": progress}
    result = simulate(workload, capacity_blocks, policy, **kwargs)
    infinite = simulate_infinite(workload, **kwargs)
    optimum = simulate(workload, capacity_blocks, BELADY, **kwargs) if belady else None
    return SimReport(result, infinite, optimum)
