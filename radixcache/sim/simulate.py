"""Replay a trace through `RadixCache` (no model) at a capacity, a page size and a policy, and report hit rates.

Each request, in arrival order: match its prompt, lock the match, allocate blocks for the rest of prompt plus
recorded output (evicting as the policy says), and, when it finishes, insert and unlock. With `concurrency` N,
up to N requests are in flight: when admitting a request would make N+1, the oldest in flight finishes
first (requests finish in arrival order; the trace has no durations). In-flight requests keep their matched
path locked and their new blocks held, so they press on the cache exactly as running requests do; their new
prompt blocks become shareable when they finish. Concurrency 1 is plain sequential replay.

A prompt is matched in full (no token is held back for logits), so the infinite-cache hit rate equals the
count of prefix blocks seen before. A request larger than the whole cache caches what fits.

With host and disk tiers under the device cache (`tiers=TierConfig(...)`, radixcache.sim.tiers) the replay is a
TieredReplay: the same device accounting, plus the pages loaded from each tier and a modelled TTFT.
"""

from __future__ import annotations

import copy
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Union

from radixcache.cache import RadixCache
from radixcache.errors import RadixCacheError
from radixcache.policy.admission import AdmissionPolicy, AdmissionRequest, make_admission
from radixcache.policy.base import EvictionPolicy
from radixcache.policy.registry import make_policy
from radixcache.sim.belady import BeladyPolicy
from radixcache.sim.flat import FlatBeladyReplay, flat_replay
from radixcache.sim.flat_lru import FlatLRUReplay
from radixcache.sim.fork import ForkedCall
from radixcache.sim.infinite_ids import id_range, match_chunk
from radixcache.sim.inflight import InFlight
from radixcache.sim.oracle import ChainedNextUseOracle, DeadBlockLRU, NextUseOracle
from radixcache.sim.packing import RequestPacker, unpack_requests
from radixcache.sim.prefixes import PrefixSet
from radixcache.sim.read_ahead import ReadAhead
from radixcache.sim.tiers import TIERS, LatencyDigest, TierConfig, TierResult, build_tiers
from radixcache.tokens import as_token_array
from radixcache.trace.workload import SimRequest, Workload

if TYPE_CHECKING:
    from radixcache.sim.source import TraceSource

#: what `simulate` replays: requests in memory, or a trace file streamed (radixcache.sim.source)
Replayable = Union[Workload, "TraceSource"]

BELADY = "belady"  # Belady's optimum when every page of a running request must be cached (resident)
BELADY_ADMISSION = "belady-admission"  # Belady's optimum when a request's pages may skip the cache (admission)
DEAD_LRU = "lru-dead"  # LRU that knows which blocks are never read again: a diagnostic bound
ORACLE_POLICIES = (BELADY, BELADY_ADMISSION, DEAD_LRU)
#: what each offline run bounds, as the CLI, the JSON and the docs name it: compare a policy without admission
#: with the resident bound, and one with admission with the admission bound
BOUND_LABELS = {
    BELADY: "bound: Belady, resident",
    BELADY_ADMISSION: "bound: Belady with admission",
    DEAD_LRU: "diagnostic: LRU told the dead blocks",
}


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
    tiers: TierResult | None = None  # a tiered replay's (TieredReplay): per-tier hits and modelled TTFT
    admission: str | None = None  # the admission policy's name, when one decided what the tree adopts
    declined_pages: int = 0  # pages the admission policy kept out of the tree
    # The cache's clock: "requests" ticks once per match or insert; "timestamps" follows the trace's arrival times
    # (microseconds; `honor_timestamps`), so a policy that measures intervals (`reuse`) measures time.
    clock: str = "requests"

    @property
    def hit_rate(self) -> float:
        """Hit tokens over prompt tokens (over every tier, for a tiered replay)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        """Hit blocks over prompt blocks (a prompt's partial last page counts as a block that can miss)."""
        return self.hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0


@dataclass(frozen=True, slots=True)
class SimReport:
    """A replay with its bounds: the same trace through an infinite cache (None when not asked for), and through
    Belady's optimum."""

    result: SimResult
    infinite: SimResult | None
    belady: SimResult | None = None  # the resident bound (BELADY)
    belady_admission: SimResult | None = None  # the admission bound (BELADY_ADMISSION)

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
            "windows": [
                {"start_ms": w.start_ms, "end_ms": w.end_ms, "requests": w.requests, "hit_rate": w.hit_rate}
                for w in r.windows
            ],
            "seconds": r.seconds,
            "clock": r.clock,
        }
        if self.infinite is not None:
            out["infinite_hit_rate"] = self.infinite.hit_rate
            out["infinite_block_hit_rate"] = self.infinite.block_hit_rate
        if r.admission is not None:
            out["admission"] = r.admission
            out["declined_pages"] = r.declined_pages
        bounds = {}
        if self.belady is not None:  # the resident bound keeps its old keys
            out["belady_hit_rate"] = self.belady.hit_rate
            out["belady_block_hit_rate"] = self.belady.block_hit_rate
            bounds[BELADY] = BOUND_LABELS[BELADY]
        if self.belady_admission is not None:
            out["belady_admission_hit_rate"] = self.belady_admission.hit_rate
            out["belady_admission_block_hit_rate"] = self.belady_admission.block_hit_rate
            bounds[BELADY_ADMISSION] = BOUND_LABELS[BELADY_ADMISSION]
        if bounds:
            out["bounds"] = bounds
        if r.tiers is not None:
            out.update(r.tiers.as_dict())
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
    tiers: TierConfig | None = None,
    admission: str | AdmissionPolicy | None = None,
    honor_timestamps: bool = False,
    flat: bool = True,
) -> SimResult:
    """Replay `workload` (an in-memory Workload, or a streamed TraceSource read once) through a cache of
    `capacity_blocks` blocks at `policy`. Memory is the cache's (and, for a trace whose first and last timestamps
    cannot be read up front, such as msgpack, 24 bytes per request for the time windows).

    `policy` may also name an offline oracle, evicting block by block after reading the trace once more:
    "belady" (the optimum when every page of a running request must be cached), "belady-admission" (the optimum
    when a request's pages may skip the cache: only what stays between requests is bounded) or "lru-dead" (LRU
    that knows which blocks are never read again).

    `admission`: a policy (radixcache.policy.admission) deciding how many of each finished request's pages the tree
    adopts; the rest are freed. None adopts everything, as "all" does, but reports no admission.

    `tiers`: replay through the device cache with host and disk tiers under it (TieredReplay); the result's
    `tiers` then holds the per-tier hits and the modelled TTFT. Oracle policies are device-only.

    `honor_timestamps`: the cache's clock follows the requests' timestamps (in microseconds, moving on by at least
    one tick per match or insert) instead of counting accesses. Every policy's order is unchanged; a policy that
    measures intervals (`reuse`) then measures trace time, so a burst of requests is not mistaken for a long wait.

    `flat`: Belady and LRU on a hash trace at concurrency 1 run over single blocks instead of the tree, with the
    same figures in a fraction of the time (radixcache.sim.flat, radixcache.sim.flat_lru); False runs the
    tree (to time it, or to compare the two).

    `progress(n)` is called now and then with the number of requests replayed since its last call. `check`
    runs the cache's full invariant check after every request (slow: for tests).
    """
    replay: CacheReplay | TieredReplay | FlatBeladyReplay | FlatLRUReplay
    if tiers is not None:
        if admission is not None:
            raise RadixCacheError("admission control is simulated on the device cache alone, not with tiers")
        replay = TieredReplay(
            workload,
            capacity_blocks,
            policy,
            tiers=tiers,
            concurrency=concurrency,
            check=check,
            windows=windows,
            honor_timestamps=honor_timestamps,
        )
    else:
        replay = device_replay(
            workload,
            capacity_blocks,
            policy,
            concurrency=concurrency,
            check=check,
            windows=windows,
            admission=admission,
            honor_timestamps=honor_timestamps,
            flat=flat,
        )
    if isinstance(replay, FlatBeladyReplay):
        replay.run(progress)  # from what it read of the trace: no second pass
    else:
        _drive(workload, [replay], progress)
    if isinstance(replay, FlatLRUReplay) and replay.broken:  # the trace needs the tree after all
        replay = device_replay(
            workload,
            capacity_blocks,
            policy,
            concurrency=concurrency,
            windows=windows,
            honor_timestamps=honor_timestamps,
            flat=False,
        )
        _drive(workload, [replay], None)
    return replay_result(replay)


def replay_result(replay: CacheReplay | TieredReplay | FlatBeladyReplay | FlatLRUReplay) -> SimResult:
    """What a replay measured (a flat one keeps CacheReplay's counters)."""
    if isinstance(replay, FlatBeladyReplay):
        return _result(replay, BELADY, replay.capacity_blocks, replay.evicted, replay.oversized)
    if isinstance(replay, FlatLRUReplay):
        return _result(replay, "lru", replay.capacity_blocks, replay.evicted, replay.oversized)
    return replay.result()


def device_replay(
    workload: Replayable,
    capacity_blocks: int,
    policy: str | EvictionPolicy,
    *,
    concurrency: int = 1,
    check: bool = False,
    windows: int = 20,
    admission: str | AdmissionPolicy | None = None,
    honor_timestamps: bool = False,
    flat: bool = True,
) -> CacheReplay | FlatBeladyReplay | FlatLRUReplay:
    """The replay of one device cache: a flat one where it gives the tree's figures (`flat`, see `simulate`),
    else a CacheReplay."""
    if flat and admission is None and not check:
        replay = flat_replay(
            workload,
            capacity_blocks,
            policy,
            concurrency=concurrency,
            timeline=lambda: _Timeline(windows, trace_span(workload)),
            honor_timestamps=honor_timestamps,
        )
        if replay is not None:
            return replay
    return CacheReplay(
        workload,
        capacity_blocks,
        policy,
        concurrency=concurrency,
        check=check,
        windows=windows,
        admission=admission,
        honor_timestamps=honor_timestamps,
    )


def simulate_infinite(
    workload: Replayable,
    *,
    concurrency: int = 1,
    windows: int = 20,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """The replay through a cache that never evicts, without building one (InfiniteReplay): the same figures as
    `simulate` at a capacity nothing fills."""
    span = trace_span(workload)
    replay = InfiniteReplay(workload, concurrency=concurrency, windows=windows, span=span)
    _drive(workload, [replay], progress)
    if replay.broken:  # ids that are not chained hashes: again, by sequence
        replay = InfiniteReplay(workload, concurrency=concurrency, chained=True, windows=windows, span=span)
        _drive(workload, [replay], None)
    return replay.result()


def trace_span(workload: Replayable) -> tuple[float, float] | None:
    """The first and last timestamps, when they can be known before the replay (None: an empty trace, or a
    stream whose end cannot be read first)."""
    if isinstance(workload, Workload):
        reqs = workload.requests
        return (reqs[0].timestamp_ms, reqs[-1].timestamp_ms) if reqs else None
    return workload.span()


def _drive(workload: Replayable, replays: list, progress: Callable[[int], None] | None) -> None:
    """One pass over the workload, each request fed to every replay in turn."""
    count = 0
    for index, request in enumerate(workload):
        for replay in replays:
            replay.feed(index, request)
        count = index + 1
        if progress is not None and index % 256 == 255:
            progress(256)
    for replay in replays:
        replay.close()
    if progress is not None and count % 256:
        progress(count % 256)


class CacheReplay:
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
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise RadixCacheError(f"concurrency must be a positive int, got {concurrency!r}")
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
        self.capacity_blocks = capacity_blocks
        self.page_size, self.block_tokens = workload.page_size, workload.block_tokens
        self.concurrency = concurrency
        self.check = check
        self.honor_timestamps = honor_timestamps
        self.timeline = _Timeline(windows, trace_span(workload))
        self.inflight = InFlight(concurrency)
        self.prompt_blocks = self.hit_blocks = self.oversized = 0
        self.seconds = 0.0

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
        # Validated once as int64 arrays, which the cache's match and insert then take without another pass.
        full = as_token_array(request.prompt + request.output if request.output else request.prompt)
        prompt = full[: len(request.prompt)] if request.output else full
        match = cache.match_prefix(prompt, namespace=request.namespace)
        cache.lock(match.node)
        matched_pages = len(match.blocks)
        hit = min(match.length * request.unit, request.prompt_tokens)
        need = -(-len(full) // p) - matched_pages
        room = cache.free_blocks + cache.evictable_blocks
        if need > room:  # larger than what the cache can free: cache the whole pages that fit
            self.oversized += 1
            need = room
            full = full[: (matched_pages + room) * p]
        # A request an engine recorded also held, while it ran, the page it was still writing: one block more,
        # which never enters the tree (SimRequest.holds_tail).
        tail = request.holds_tail and len(full) % p == 0 and need < room
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
        if early > matched_pages:  # its prompt's pages go into the tree now, pinned until it finishes
            cache.insert(full[: early * p], blocks[:early], namespace=request.namespace)
            pinned = cache.lock_prefix(full, early * p, namespace=request.namespace)  # all cached: never None
            if pinned is not None:
                cache.unlock(match.node)
                node = pinned
        self.inflight.add(
            (node, full, blocks, request.namespace, matched_pages, len(prompt) // p, output_tokens, held),
            request.finish_ms,
        )
        self.prompt_blocks += -(-len(request.prompt) // p)
        self.hit_blocks += matched_pages
        self.timeline.add(request.timestamp_ms, request.prompt_tokens, hit)
        if self.check:
            cache.check_invariants()
        self.seconds += time.perf_counter() - started

    def _complete(self, item: tuple) -> None:
        """A request finishes: the tree adopts its pages (as many as admission allows) and it unlocks its match."""
        node, full, blocks, namespace, matched, prompt_pages, output_tokens, held = item
        cache, p = self.cache, self.cache.page_size
        if held:
            cache.free(held)
        if self.expect is not None:  # every request says it before its insert, so none is left for another's
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
            _finish(cache, (node, full, blocks, namespace), p)
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
        base = _result(self, name, self.capacity_blocks, evicted, self.oversized)
        admission = self.admission.name if self.admission is not None else None
        return replace(base, admission=admission, declined_pages=self.declined_pages)


def _largest_request_pages(workload: Replayable) -> int:
    """The most pages one request of `workload` inserts (prompt and output): the room one in flight needs."""
    p = workload.page_size
    return max((-(-(len(r.prompt) + len(r.output)) // p) for r in workload), default=1)


class TieredReplay:
    """One replay through a TieredCache (radixcache.tier): the device RadixCache of `capacity_blocks`, with the
    host and disk tiers of `tiers` under it, fed like CacheReplay.

    Each request: the device match, then the pages after it that the host holds, then those after them that the
    disk holds (TieredCache.match). The device match is locked and counted as CacheReplay counts it; the host and
    disk pages are loaded (hits of their tier) when loading is cheaper than recomputing them (TierCosts.loads), and
    otherwise recomputed (misses). The request then takes device blocks for all its pages past the device match,
    exactly as CacheReplay does (the loaded pages land in some of them), with the host pages it loads locked while
    the allocation evicts (a write-back may store into the host). When it finishes its pages are inserted into the
    tree, and the pages the tree adopts are handed to `TieredCache.adopted`: copied to the host under write_through,
    and stored in the disk (every adopted page is written through to the disk). Device evictions reach the host
    through the tree's eviction listener (write_back copies them there; the other policies refresh their copies).

    The device's contents do not depend on the tiers (a request's pages go to the device whether they were loaded
    or recomputed, and the tiers never change the tree), so the device hits are those of the same cache without
    tiers, and with neither a host nor a disk every figure is CacheReplay's, to the block. Each request's modelled
    TTFT (radixcache.sim.tiers) goes into a LatencyDigest, beside the same model with the device alone (its
    device hits only) and with no cache at all.

    Tier keys (`key`): by default a hash trace's pages are keyed by their hash ids ("hash-id": chained ids name their
    whole prefix), and a token trace's by radixcache.page_hash's chained blake2b hashes ("blake2b").
    """

    def __init__(
        self,
        workload: Replayable,
        capacity_blocks: int,
        policy: str | EvictionPolicy = "lru",
        *,
        tiers: TierConfig | None = None,
        concurrency: int = 1,
        check: bool = False,
        windows: int = 20,
        key: str | None = None,
        honor_timestamps: bool = False,
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise RadixCacheError(f"concurrency must be a positive int, got {concurrency!r}")
        if isinstance(policy, str) and policy in ORACLE_POLICIES:
            raise RadixCacheError(f"the offline policy {policy!r} replays the device cache alone, without tiers")
        config = tiers if tiers is not None else TierConfig()
        self.cache = RadixCache(capacity_blocks, page_size=workload.page_size, policy=make_policy(policy))
        if key is None:
            key = "hash-id" if workload.kind == "hash" and workload.page_size == 1 else "blake2b"
        self.config, self.key = config, key
        self.tiered, self.host, self.disk = build_tiers(self.cache, config, key)
        self.any_tier = self.host is not None or self.disk is not None
        self.capacity_blocks = capacity_blocks
        self.page_size, self.block_tokens = workload.page_size, workload.block_tokens
        self.concurrency = concurrency
        self.check = check
        self.honor_timestamps = honor_timestamps
        self.timeline = _Timeline(windows, trace_span(workload))
        self.inflight = InFlight(concurrency)
        self.prompt_blocks = self.hit_blocks = self.oversized = 0
        self.seconds = 0.0
        costs, page_tokens = config.costs, workload.block_tokens
        self.prefill_s = costs.prefill_s_per_token
        self.host_s = costs.load_s_per_page("host", page_tokens)
        self.disk_s = costs.load_s_per_page("disk", page_tokens)
        self.load_host = self.host is not None and costs.loads("host", page_tokens)
        self.load_disk = self.disk is not None and costs.loads("disk", page_tokens)
        self.hits = [0, 0, 0]  # prompt tokens served by the device, the host, the disk
        self.loaded = [0, 0]  # pages loaded from the host, the disk
        self.ttft = LatencyDigest()
        self.ttft_device_only = LatencyDigest()
        self.ttft_no_cache = LatencyDigest()

    def feed(self, index: int, request: SimRequest) -> None:
        started = time.perf_counter()
        cache, p = self.cache, self.page_size
        for item in self.inflight.due(request.timestamp_ms):
            self._finish(item)
        if self.honor_timestamps:
            advance_to_arrival(cache, request)
        full = as_token_array(request.prompt + request.output if request.output else request.prompt)
        prompt = full[: len(request.prompt)] if request.output else full
        chain = self.tiered.chain(request.namespace) if self.any_tier else None
        found = self.tiered.match(prompt, request.namespace, chain)
        match = found.device
        cache.lock(match.node)
        matched_pages = len(match.blocks)
        need = -(-len(full) // p) - matched_pages
        room = cache.free_blocks + cache.evictable_blocks
        if need > room:  # larger than what the cache can free: cache the whole pages that fit
            self.oversized += 1
            need = room
            full = full[: (matched_pages + room) * p]
        # Pages loaded land in the request's new blocks, so no more of them than it gets.
        host_found = found.host_pages
        host_pages = min(host_found, need) if self.load_host else 0
        disk_pages = max(0, min(found.lower_pages, need - host_found)) if self.load_disk else 0
        if host_pages:  # being copied up: a write-back into the host during the allocation must not evict them
            reading = list(dict.fromkeys(found.hashes[matched_pages : matched_pages + host_pages]))
            self.host.lock(reading)  # type: ignore[union-attr]
            new = cache.allocate(need)
            self.host.unlock(reading)  # type: ignore[union-attr]
        else:
            new = cache.allocate(need)
        self.inflight.add((match.node, full, match.blocks + new, request.namespace, chain), request.finish_ms)
        tokens = request.prompt_tokens
        page_tokens = p * request.unit
        device_hit = min(matched_pages * page_tokens, tokens)
        host_hit = min((matched_pages + host_pages) * page_tokens, tokens) - device_hit
        disk_start = min((matched_pages + host_found) * page_tokens, tokens)
        disk_hit = min((matched_pages + host_found + disk_pages) * page_tokens, tokens) - disk_start
        hit = device_hit + host_hit + disk_hit
        hits = self.hits
        hits[0] += device_hit
        hits[1] += host_hit
        hits[2] += disk_hit
        self.loaded[0] += host_pages
        self.loaded[1] += disk_pages
        prefill_s = self.prefill_s
        self.ttft.add(prefill_s * (tokens - hit) + self.host_s * host_pages + self.disk_s * disk_pages)
        self.ttft_device_only.add(prefill_s * (tokens - device_hit))
        self.ttft_no_cache.add(prefill_s * tokens)
        self.prompt_blocks += -(-len(request.prompt) // p)
        self.hit_blocks += matched_pages + host_pages + disk_pages
        self.timeline.add(request.timestamp_ms, tokens, hit)
        if self.check:
            self.check_invariants()
        self.seconds += time.perf_counter() - started

    def _finish(self, item: tuple) -> None:
        """Insert a finished request, hand the pages the tree adopted to the tiers, and unlock its match."""
        node, full, blocks, namespace, chain = item
        cache, p = self.cache, self.page_size
        cached = cache.insert(full, blocks, namespace=namespace) // p
        pages = len(full) // p
        if chain is not None and pages > cached:
            self.tiered.adopted(chain.upto(full, pages)[cached:], blocks[cached:pages], full[cached * p : pages * p])
        if len(full) % p:
            cache.free(blocks[-1:])  # the unaligned tail page never enters the tree
        cache.unlock(node)

    def check_invariants(self) -> None:
        self.tiered.check_invariants()
        if self.disk is not None:
            self.disk.check_invariants()

    def close(self) -> None:
        for item in self.inflight.drain():
            self._finish(item)
        if self.check:
            self.check_invariants()

    def result(self) -> SimResult:
        config = self.config
        present = config.tiers
        stats = {t.name: t.stats for t in (self.host, self.disk) if t is not None}
        tiers = TierResult(
            write_policy=config.write_policy,
            host_capacity_blocks=config.host_capacity_blocks,
            disk_capacity_blocks=config.disk_capacity_blocks,
            costs=config.costs,
            page_tokens=self.block_tokens,
            prompt_tokens=self.timeline.prompt_tokens,
            hit_tokens={tier: n for tier, n in zip(TIERS, self.hits, strict=True) if tier in present},
            loaded_blocks={tier: n for tier, n in zip(TIERS[1:], self.loaded, strict=True) if tier in present},
            tier_stats=stats,
            ttft=self.ttft.summary(),
            ttft_device_only=self.ttft_device_only.summary(),
            ttft_no_cache=self.ttft_no_cache.summary(),
            key=self.key,
        )
        return _result(
            self, self.cache.policy.name, self.capacity_blocks, self.cache.stats.evicted_blocks, self.oversized, tiers
        )


class InfiniteReplay:
    """A cache that never evicts, kept as a table instead of a tree: the same hits as a RadixCache that nothing
    fills, in a few bytes per distinct page.

    Hash traces (page size 1, ids below 2**27): a page is its hash id, and `parent[id]` the id before it (or the
    root), kept in an int64 array indexed by id, 8 bytes per id up to the largest. A prompt hits its leading ids
    whose recorded parent is the id before them. That is exact as long as every id follows one parent throughout
    the trace, which chained block hashes guarantee; a trace where an id follows two parents (or an id is too
    large for the array) marks the replay `broken`, and the caller replays it again with `chained=True`, by
    sequence. By sequence (token traces, and that fallback): each inserted sequence is kept (a sorted list of int64
    bytes, radixcache.sim.prefixes), a prompt hits the whole pages it shares with the closest one, and a
    sequence that a later one extends is dropped; exact, with no hashing.
    By id at concurrency 1, requests are matched in chunks, in numpy (radixcache.sim.infinite_ids), with the
    same figures.
    """

    def __init__(
        self,
        workload: Replayable,
        *,
        concurrency: int = 1,
        chained: bool = False,
        windows: int = 20,
        span: tuple[float, float] | None = None,
        chunk_ids: int | None = 1 << 15,
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise RadixCacheError(f"concurrency must be a positive int, got {concurrency!r}")
        self.page_size, self.block_tokens, self.concurrency = workload.page_size, workload.block_tokens, concurrency
        # By id for hash traces (a token trace's ids follow many parents: it goes by sequence from the start).
        self.by_id = self.page_size == 1 and not chained and getattr(workload, "kind", None) == "hash"
        self.broken = False  # by id, an id followed two parents: the figures are void, replay by sequence
        self.parent = array("q")  # by id: 0 unseen, 1 the root, id + 2 the id before it
        self.distinct = 0
        self.prefixes = PrefixSet()  # not by id: the sequences inserted, as int64 bytes
        self.timeline = _Timeline(windows, span)
        self.inflight = InFlight(concurrency)
        self.prompt_blocks = self.hit_blocks = 0
        self.seconds = 0.0
        # By id at concurrency 1, requests are matched a chunk of `chunk_ids` ids at a time (None: one at a time;
        # radixcache.sim.infinite_ids) until one arrives that an engine recorded (it finishes at its own time):
        # from then on, one at a time.
        self.chunked = self.by_id and concurrency == 1 and chunk_ids is not None
        self.chunk_size = chunk_ids or 0
        self.gathered_ids = array("q")
        self.chunk: list[SimRequest] = []

    def feed(self, index: int, request: SimRequest) -> None:
        if self.broken:
            return
        started = time.perf_counter()
        if self.chunked:
            if request.namespace is None and request.finish_ms is None and not request.output:
                try:
                    self.gathered_ids.extend(request.prompt)
                except (OverflowError, TypeError):  # an id past int64: past the parent array's limit too
                    self.broken = True
                    return
                self.chunk.append(request)
                if len(self.gathered_ids) >= self.chunk_size:
                    self._match_chunk()
                self.seconds += time.perf_counter() - started
                return
            self._match_chunk()
            self.chunked = False
            if self.broken:
                return
        for item in self.inflight.due(request.timestamp_ms):
            self._insert(*item)
        p = self.page_size
        root = ("namespace", request.namespace)
        full = request.prompt + request.output if request.output else request.prompt
        prompt_pages = len(request.prompt) // p
        matched = 0
        if self.by_id:
            prompt = request.prompt
            if request.namespace is not None or not self._room_for(full):  # the pages it will insert too
                self.broken = True
                return
            # The hit is the longest run of leading ids whose recorded parent is the id before them. Prefix
            # equality is monotone in the length, so a binary search over C-level list comparisons finds it.
            got = list(map(self.parent.__getitem__, prompt))
            want = [_ROOT, *map(_ENCODE, prompt[:-1])]
            low, high = 0, len(prompt)
            while low < high:
                mid = (low + high + 1) // 2
                if got[:mid] == want[:mid]:
                    low = mid
                else:
                    high = mid - 1
            matched = low
            early = shared_early(request, len(full), 1)
            if early > matched:  # shared while it runs (see `shared_early`)
                self._insert(root, full[:early], matched)
            self.inflight.add((root, full, max(matched, early)), request.finish_ms)
        else:
            # The whole pages, as int64 bytes (radixcache.sim.prefixes); a bad token raises as the tree would.
            data = as_token_array(full)[: len(full) // p * p].tobytes()
            namespace = request.namespace
            matched = self.prefixes.longest(namespace, data[: prompt_pages * p * _TOKEN_BYTES]) // p
            early = shared_early(request, len(full) // p, p)
            if early:  # shared while it runs (see `shared_early`)
                self._insert(namespace, data[: early * p * _TOKEN_BYTES], 0)
            self.inflight.add((namespace, data, 0), request.finish_ms)
        self.prompt_blocks += -(-len(request.prompt) // p)
        self.hit_blocks += matched
        self.timeline.add(
            request.timestamp_ms, request.prompt_tokens, min(matched * p * request.unit, request.prompt_tokens)
        )
        self.seconds += time.perf_counter() - started

    def _match_chunk(self) -> None:
        """Match and record the chunk of requests gathered so far, one after the other."""
        chunk, ids = self.chunk, self.gathered_ids
        self.chunk, self.gathered_ids = [], array("q")
        if not chunk:
            return
        if ids:
            low, top = id_range(ids)
            if low < 0 or not self._room_for_id(top):
                self.broken = True
                return
        matched = match_chunk(self.parent, ids, [len(request.prompt) for request in chunk])
        if matched is None:  # an id after two parents
            self.broken = True
            return
        hits, self.distinct = matched[0], self.distinct + matched[1]
        add = self.timeline.add
        for request, hit in zip(chunk, hits, strict=True):
            self.prompt_blocks += len(request.prompt)
            self.hit_blocks += hit
            tokens = request.prompt_tokens
            add(request.timestamp_ms, tokens, min(hit * request.unit, tokens))

    def _insert(self, root: object, pages: Sequence[int], known: int) -> None:
        """Record a finished request's pages (`known` leading ones were matched, so they are there already)."""
        if not self.by_id:  # `root` is the namespace, `pages` the int64 bytes of whole pages
            known_tokens = self.prefixes.add(root, pages)  # type: ignore[arg-type]
            self.distinct += len(pages) // _TOKEN_BYTES // self.page_size - known_tokens // self.page_size
            return
        parent = self.parent
        prev = pages[known - 1] + 2 if known else _ROOT
        for page in pages[known:]:
            recorded = parent[page]
            if not recorded:
                parent[page] = prev
                self.distinct += 1
            elif recorded != prev:  # one id after two parents: not a chained-hash trace
                self.broken = True
                return
            prev = page + 2

    def _room_for(self, prompt: Sequence[int]) -> bool:
        """Grow the parent array to hold every id of `prompt` (doubling); False past the array's limit."""
        return not prompt or self._room_for_id(max(prompt))

    def _room_for_id(self, top: int) -> bool:
        """Grow the parent array to hold id `top` (doubling); False past the array's limit."""
        if top < len(self.parent):
            return True
        if top >= _MAX_IDS:
            return False
        grow = max(top + 1, 2 * len(self.parent), 1024) - len(self.parent)
        self.parent.frombytes(bytes(8 * grow))
        return True

    def close(self) -> None:
        if self.chunked and not self.broken:
            started = time.perf_counter()
            self._match_chunk()
            self.seconds += time.perf_counter() - started
        for item in self.inflight.drain():
            if self.broken:
                break
            self._insert(*item)

    def summary(self) -> tuple[bool, SimResult | None]:
        """(broken, the result unless broken): what a replay beside the reading (ReadAhead) sends back."""
        return self.broken, (None if self.broken else self.result())

    def result(self) -> SimResult:
        if self.broken:
            raise RadixCacheError("an id followed two parents: replay this trace by sequence (chained=True)")
        return _result(self, "lru", max(1, self.distinct), 0, 0)


_ROOT = 1  # the parent of a prompt's first id
_TOKEN_BYTES = 8  # an int64 token's bytes
_ENCODE = (2).__add__  # an id as the parent of the next one
_MAX_IDS = 1 << 27  # the parent array's limit: 1 GiB


def _result(
    replay: CacheReplay | InfiniteReplay | TieredReplay | FlatBeladyReplay | FlatLRUReplay,
    policy: str,
    capacity: int,
    evicted: int,
    oversized: int,
    tiers: TierResult | None = None,
) -> SimResult:
    """A replay's figures: its counters and time windows, with what only its kind knows."""
    t = replay.timeline
    return SimResult(
        policy=policy,
        capacity_blocks=capacity,
        page_size=replay.page_size,
        block_tokens=replay.block_tokens,
        concurrency=replay.concurrency,
        requests=t.requests,
        prompt_tokens=t.prompt_tokens,
        hit_tokens=t.hit_tokens,
        prompt_blocks=replay.prompt_blocks,
        hit_blocks=replay.hit_blocks,
        evicted_blocks=evicted,
        oversized_requests=oversized,
        windows=t.windows(),
        seconds=replay.seconds,
        tiers=tiers,
        clock="timestamps" if getattr(replay, "honor_timestamps", False) else "requests",
    )


class _Timeline:
    """Each request's arrival time, prompt tokens and hit tokens, cut into `count` windows of equal length from the
    first arrival to the last. With the trace's `span` (first and last timestamp) known up front, requests go
    straight into their window (constant memory); without it they are kept in flat arrays (24 bytes a request)
    and cut once the trace has gone by. Both give the same windows."""

    def __init__(self, count: int = 20, span: tuple[float, float] | None = None) -> None:
        if type(count) is not int or count < 1:
            raise RadixCacheError(f"windows must be a positive int, got {count!r}")
        self.count, self.span = count, span
        self.times = array("d")
        self.prompts = array("q")
        self.hits = array("q")
        self.bins = [[0, 0, 0] for _ in range(count)]  # requests, prompt tokens, hit tokens
        self.requests = self.prompt_tokens = self.hit_tokens = 0
        if span is not None:
            t0, t1 = span
            self.t0, self.width = t0, ((t1 - t0) / count if t1 > t0 else 1.0)

    def add(self, timestamp_ms: float, prompt_tokens: int, hit_tokens: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        self.hit_tokens += hit_tokens
        if self.span is None:
            self.times.append(timestamp_ms)
            self.prompts.append(prompt_tokens)
            self.hits.append(hit_tokens)
            return
        row = self.bins[min(max(int((timestamp_ms - self.t0) / self.width), 0), self.count - 1)]
        row[0] += 1
        row[1] += prompt_tokens
        row[2] += hit_tokens

    def add_many(self, timestamps_ms: list[float], prompt_tokens: list[int], hit_tokens: list[int]) -> None:
        """`add` for each request in turn (a hit past its prompt counts as the prompt), with the same windows."""
        hits = [hit if hit < tokens else tokens for hit, tokens in zip(hit_tokens, prompt_tokens, strict=True)]
        self.requests += len(hits)
        self.prompt_tokens += sum(prompt_tokens)
        self.hit_tokens += sum(hits)
        if self.span is None:
            self.times.extend(timestamps_ms)
            self.prompts.extend(prompt_tokens)
            self.hits.extend(hits)
            return
        import numpy as np  # imported here: only the flat replays, which use numpy anyway, add in bulk

        # `add`'s window, computed the same way: the float quotient truncated toward zero, then clamped.
        at = ((np.array(timestamps_ms, dtype=np.float64) - self.t0) / self.width).astype(np.int64)
        at = np.clip(at, 0, self.count - 1)
        counts = np.bincount(at, minlength=self.count).tolist()
        prompts = np.bincount(at, np.array(prompt_tokens, dtype=np.int64), self.count)
        hit_sums = np.bincount(at, np.array(hits, dtype=np.int64), self.count)
        for row, n, tokens, hit in zip(self.bins, counts, prompts.tolist(), hit_sums.tolist(), strict=True):
            row[0] += n
            row[1] += round(tokens)  # float64 sums of ints: exact below 2**53 tokens per window and call
            row[2] += round(hit)

    def windows(self) -> tuple[Window, ...]:
        count = self.count
        if self.span is None:
            times = self.times
            self.t0 = times[0] if times else 0.0
            span = (times[-1] - self.t0) if times else 0.0
            self.width = span / count if span > 0 else 1.0
            for t, n, h in zip(times, self.prompts, self.hits, strict=True):
                row = self.bins[min(int((t - self.t0) / self.width), count - 1)]
                row[0] += 1
                row[1] += n
                row[2] += h
        t0, width = self.t0, self.width
        return tuple(Window(t0 + i * width, t0 + (i + 1) * width, *self.bins[i]) for i in range(count))


def shared_early(request: SimRequest, pages: int, p: int) -> int:
    """How many of a request's `pages` (of p cache tokens) the tree holds from the moment it starts.

    An engine shares a prompt's pages as soon as it computes them, and one that arrives meanwhile with the same prefix
    reuses them (the engine's in-flight sharing). A request an engine recorded (it says when it finished:
    `finish_ms`) therefore gives the tree its prompt's whole pages when it starts, and the rest when it finishes.
    Any other request gives them all when it finishes (0 here).
    """
    if request.finish_ms is None:
        return 0
    return min(request.prompt_tokens // request.unit // p, pages)


def advance_to_arrival(cache: RadixCache, request: SimRequest) -> None:
    """Move the cache's clock to the request's arrival time, in microseconds (`honor_timestamps`)."""
    at = int(request.timestamp_ms * 1000)
    if at > 0:
        cache.advance_clock(at)


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
    infinite: bool = True,
    windows: int = 20,
    progress: Callable[[int], None] | None = None,
    tiers: TierConfig | None = None,
    admission: str | AdmissionPolicy | None = None,
    belady_admission: bool = False,
    parallel: bool = False,
    honor_timestamps: bool = False,
    flat: bool = True,
) -> SimReport:
    """`simulate` plus its bounds: the infinite-cache replay (unless `infinite=False`: its table grows with the
    trace's distinct pages, where the policy's replay holds only the cache), and Belady's when asked for. The
    policy's replay and the infinite one share one pass (the infinite one in the reader process, when `workload` is
    a TraceSource that reads ahead); Belady's oracle reads the trace once more, then replays.

    With `tiers` the policy's replay is a TieredReplay (its result's `tiers` holds the per-tier hits and the
    modelled TTFT, with the device alone and with no cache for comparison); the bounds stay device-only. A hash
    trace's tiers are keyed by its ids; should the infinite replay find an id after two parents (ids that are not
    chained), the tiered replay runs again keyed by blake2b hashes of the id chain.

    `admission` decides what the tree adopts (device-only); `belady_admission` adds the admission bound (Belady
    when a request's pages may skip the cache), the one to compare a policy with admission against.

    `honor_timestamps`: the caches' clocks follow the trace's timestamps (see `simulate`). `flat`: see `simulate`.

    `parallel`: the Belady replays run in forked processes beside the policy's (radixcache.sim.fork), each
    reading the trace itself; the figures are the same. For a streamed trace on a machine with cores to spare (a
    forked child copies, page by page, whatever an in-memory workload it touches shares with this process)."""
    bounds = [(BELADY, belady), (BELADY_ADMISSION, belady_admission)]
    clock = {"honor_timestamps": honor_timestamps}
    forked = {}
    if parallel:  # started before the policy's replay, so that the children copy nothing of it
        # Each reads the trace itself (a daemonic child starts no reader of its own).
        alone = replace(workload, read_ahead=False) if getattr(workload, "read_ahead", False) else workload
        for name, wanted in bounds:
            if wanted:
                forked[name] = ForkedCall(
                    partial(
                        simulate,
                        alone,
                        capacity_blocks,
                        name,
                        concurrency=concurrency,
                        windows=windows,
                        flat=flat,
                        **clock,
                    )
                )
    try:
        report = _evaluate(
            workload, capacity_blocks, policy, concurrency, infinite, windows, progress, tiers, admission, clock, flat
        )
    except BaseException:
        for call in forked.values():
            call.cancel()
        raise
    done = {}
    for name, wanted in bounds:
        if name in forked:
            done[name] = forked[name].result()
            if progress is not None:
                progress(done[name].requests)
        elif wanted:
            done[name] = simulate(
                workload,
                capacity_blocks,
                name,
                concurrency=concurrency,
                windows=windows,
                progress=progress,
                flat=flat,
                **clock,
            )
    return replace(report, belady=done.get(BELADY), belady_admission=done.get(BELADY_ADMISSION))


def _evaluate(
    workload: Replayable,
    capacity_blocks: int,
    policy: str | EvictionPolicy,
    concurrency: int,
    infinite: bool,
    windows: int,
    progress: Callable[[int], None] | None,
    tiers: TierConfig | None,
    admission: str | AdmissionPolicy | None,
    clock: dict,
    flat: bool = True,
) -> SimReport:
    """The policy's replay and the infinite bound's (see `evaluate`)."""
    replay: CacheReplay | TieredReplay | FlatBeladyReplay | FlatLRUReplay
    spare = copy.deepcopy(policy) if tiers is not None and isinstance(policy, EvictionPolicy) else policy
    if tiers is not None:
        if admission is not None:
            raise RadixCacheError("admission control is simulated on the device cache alone, not with tiers")
        replay = TieredReplay(
            workload, capacity_blocks, policy, tiers=tiers, concurrency=concurrency, windows=windows, **clock
        )
    else:
        replay = device_replay(
            workload,
            capacity_blocks,
            policy,
            concurrency=concurrency,
            windows=windows,
            admission=admission,
            flat=flat,
            **clock,
        )
    unbounded = partial(InfiniteReplay, workload, concurrency=concurrency, windows=windows, span=trace_span(workload))
    if infinite and getattr(workload, "read_ahead", False):  # the bound replays in the reader process, for free
        stream = ReadAhead(  # type: ignore[type-var]
            replace(workload, read_ahead=False), beside=unbounded, pack=RequestPacker, unpack=unpack_requests
        )
        _drive(stream, [replay], progress)
        broken, bound = stream.beside_summary
    else:
        beside = unbounded()
        _drive(workload, [replay, beside] if infinite else [replay], progress)
        broken, bound = beside.summary()
    if isinstance(replay, FlatLRUReplay) and replay.broken:  # the trace needs the tree after all
        replay = device_replay(
            workload, capacity_blocks, policy, concurrency=concurrency, windows=windows, flat=False, **clock
        )
        _drive(workload, [replay], None)
    if isinstance(replay, TieredReplay) and replay.key == "hash-id" and replay.any_tier and broken:
        replay = TieredReplay(
            workload,
            capacity_blocks,
            spare,
            tiers=tiers,
            concurrency=concurrency,
            windows=windows,
            key="blake2b",
            **clock,
        )
        _drive(workload, [replay], None)
    infinite_result = None
    if infinite and broken:
        infinite_result = simulate_infinite(workload, concurrency=concurrency, windows=windows)
    elif infinite:
        infinite_result = bound
    return SimReport(replay_result(replay), infinite_result)
