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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from radixcache.cache import RadixCache
from radixcache.errors import RadixCacheError
from radixcache.policies import BeladyPolicy, EvictionPolicy, make_policy
from radixcache.simulate_oracle import DeadBlockLRU, NextUseOracle
from radixcache.simulate_workload import Workload

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
    workload: Workload,
    capacity_blocks: int,
    policy: str | EvictionPolicy = "lru",
    *,
    concurrency: int = 1,
    windows: int = 20,
    progress: Callable[[int], None] | None = None,
    check: bool = False,
) -> SimResult:
    """Replay `workload` through a cache of `capacity_blocks` blocks at `policy`.

    `policy` may also name an offline oracle: "belady" (the optimum) or "lru-dead" (LRU that knows which
    blocks are never read again), both evicting block by block.

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
    requests = workload.requests
    t0 = requests[0].timestamp_ms if requests else 0.0
    span = (requests[-1].timestamp_ms - t0) if requests else 0.0
    width = span / windows if span > 0 else 1.0
    win_requests = [0] * windows
    win_prompt = [0] * windows
    win_hit = [0] * windows
    inflight: deque = deque()
    prompt_tokens = hit_tokens = prompt_blocks = hit_blocks = oversized = 0

    for index, request in enumerate(requests):
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

        prompt_tokens += request.prompt_tokens
        hit_tokens += hit
        prompt_blocks += -(-len(request.prompt) // p)
        hit_blocks += matched_pages
        w = min(int((request.timestamp_ms - t0) / width), windows - 1)
        win_requests[w] += 1
        win_prompt[w] += request.prompt_tokens
        win_hit[w] += hit
        if check:
            cache.check_invariants()
        if progress is not None and index % 256 == 255:
            progress(256)
    while inflight:
        _finish(cache, inflight.popleft(), p)
    if check:
        cache.check_invariants()
    if progress is not None and len(requests) % 256:
        progress(len(requests) % 256)

    return SimResult(
        policy=cache.policy.name,
        capacity_blocks=capacity_blocks,
        page_size=p,
        block_tokens=workload.block_tokens,
        concurrency=concurrency,
        requests=len(requests),
        prompt_tokens=prompt_tokens,
        hit_tokens=hit_tokens,
        prompt_blocks=prompt_blocks,
        hit_blocks=hit_blocks,
        evicted_blocks=cache.stats.evicted_blocks,
        oversized_requests=oversized,
        windows=tuple(
            Window(t0 + i * width, t0 + (i + 1) * width, win_requests[i], win_prompt[i], win_hit[i])
            for i in range(windows)
        ),
        seconds=time.perf_counter() - started,
    )


def _finish(cache: RadixCache, item: tuple, p: int) -> None:
    node, full, blocks, namespace = item
    cache.insert(full, blocks, namespace=namespace)
    if len(full) % p:
        cache.free(blocks[-1:])  # the unaligned tail page never enters the tree
    cache.unlock(node)


def infinite_capacity(workload: Workload) -> int:
    """A capacity no replay of `workload` can fill, so nothing is ever evicted."""
    return max(1, workload.total_pages)


def evaluate(
    workload: Workload,
    capacity_blocks: int,
    policy: str | EvictionPolicy = "lru",
    *,
    concurrency: int = 1,
    belady: bool = False,
    windows: int = 20,
    progress: Callable[[int], None] | None = None,
) -> SimReport:
    """`simulate` plus its bounds: the infinite-cache replay, and Belady's when asked for."""
    kwargs = {"concurrency": concurrency, "windows": windows, "progress": progress}
    result = simulate(workload, capacity_blocks, policy, **kwargs)
    infinite = simulate(workload, infinite_capacity(workload), "lru", **kwargs)
    optimum = simulate(workload, capacity_blocks, BELADY, **kwargs) if belady else None
    return SimReport(result, infinite, optimum)
