"""Replay a trace through `RadixCache` (no model) at a capacity, a page size and a policy, and report hit rates:
`simulate` (one replay), `simulate_infinite` (the infinite-cache bound), and the choice of replay they run.

What a replay does with each request is CacheReplay's (radixcache.sim.cache_replay). With host and disk tiers
under the device cache (`tiers=TierConfig(...)`, radixcache.sim.tiers) the replay is a TieredReplay
(radixcache.sim.tiered_replay): the same device accounting, plus the pages loaded from each tier and a modelled
TTFT. `evaluate` (radixcache.sim.evaluation) adds the bounds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixcache.errors import RadixCacheError
from radixcache.policy.admission import AdmissionPolicy
from radixcache.policy.base import EvictionPolicy
from radixcache.sim.cache_replay import CacheReplay
from radixcache.sim.flat import FlatBeladyReplay, flat_replay
from radixcache.sim.flat_lru import FlatLRUReplay
from radixcache.sim.infinite_replay import InfiniteReplay
from radixcache.sim.replay_common import (
    Replayable,
    check_flags,
    check_progress,
    check_workload,
    drive,
    replay_figures,
    trace_span,
)
from radixcache.sim.results import BELADY, SimResult
from radixcache.sim.tiered_replay import TieredReplay
from radixcache.sim.tiers import TierConfig
from radixcache.sim.timeline import Timeline
from radixcache.trace.workload import Workload

#: what replays one cache's policy
Replay = CacheReplay | TieredReplay | FlatBeladyReplay | FlatLRUReplay


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
    prefill_chunk: int | None = None,
) -> SimResult:
    """Replay `workload` (an in-memory Workload, or a streamed TraceSource read once) through a cache of
    `capacity_blocks` blocks at `policy`. Memory is the cache's (and, for a trace whose first and last timestamps
    cannot be read up front, such as msgpack, 24 bytes per request for the time windows).

    `policy`: a name, or an EvictionPolicy object for this replay alone (one that served a cache before keeps what it
    learned there, and is refused). It may also name an offline oracle, evicting block by block after reading the
    trace once more:
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

    `prefill_chunk`: replay a recorded trace's requests as the engine gave the tree their pages while they ran (its
    in-flight sharing): the prompt in passes of this many tokens from its match, then each page its decode filled,
    each an insert of its own, before the finish (whose insert knows the output length). None: the prompt whole at
    its start, the rest at its finish. What `reuse` learns differs (one insert, one group); the other policies'
    figures barely move. Device cache only, through the tree.

    `progress(n)` is called now and then with the number of requests replayed since its last call. `check`
    runs the cache's full invariant check after every request (slow: for tests).
    """
    check_flags(check=check, honor_timestamps=honor_timestamps, flat=flat)
    check_progress(progress)
    check_workload(workload)
    options = {"concurrency": concurrency, "windows": windows, "honor_timestamps": honor_timestamps, "flat": flat}
    chunk = {} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}
    replay = policy_replay(workload, capacity_blocks, policy, tiers, admission, check=check, **options, **chunk)
    if isinstance(replay, FlatBeladyReplay):
        replay.run(progress)  # from what it read of the trace: no second pass
    else:
        drive(workload, [replay], progress)
    return replay_result(on_the_tree_if_needed(replay, workload))


def policy_replay(
    workload: Replayable,
    capacity_blocks: int,
    policy: str | EvictionPolicy,
    tiers: TierConfig | None,
    admission: str | AdmissionPolicy | None,
    *,
    flat: bool = True,
    **options: Any,
) -> Replay:
    """The replay of `policy` that `simulate` and `evaluate` run: through the device cache with the tiers under it
    (a TieredReplay) when `tiers` are given, else the device cache's alone (`device_replay`, flat where it may be).
    `options`: the keywords both take (concurrency, check, windows, honor_timestamps)."""
    if tiers is not None and not isinstance(tiers, TierConfig):  # else an AttributeError naming no argument
        raise RadixCacheError(f"tiers must be a TierConfig or None, got {type(tiers).__name__}")
    if tiers is None:
        return device_replay(workload, capacity_blocks, policy, admission=admission, flat=flat, **options)
    if options.get("prefill_chunk") is not None:
        raise RadixCacheError(
            "prefill_chunk (the engine's commits) is simulated on the device cache alone, not with tiers"
        )
    options.pop("prefill_chunk", None)
    if admission is not None:
        raise RadixCacheError("admission control is simulated on the device cache alone, not with tiers")
    return TieredReplay(workload, capacity_blocks, policy, tiers=tiers, **options)


def on_the_tree_if_needed(replay: Replay, workload: Replayable) -> Replay:
    """A run `replay` as it is; or, when it is a flat LRU replay that found the trace needs the tree after all
    (`broken`), the same replay through the tree, run. A flat LRU replay runs at concurrency 1 with neither admission
    nor check, so the tree's replay takes only its capacity, its windows and its clock."""
    if not (isinstance(replay, FlatLRUReplay) and replay.broken):
        return replay
    tree = device_replay(
        workload,
        replay.capacity_blocks,
        "lru",
        windows=replay.timeline.count,
        honor_timestamps=replay.honor_timestamps,
        flat=False,
    )
    drive(workload, [tree], None)
    return tree


def replay_result(replay: CacheReplay | TieredReplay | FlatBeladyReplay | FlatLRUReplay) -> SimResult:
    """What a replay measured (a flat one keeps CacheReplay's counters)."""
    if isinstance(replay, FlatBeladyReplay):
        return replay_figures(replay, BELADY, replay.capacity_blocks, replay.evicted, replay.oversized)
    if isinstance(replay, FlatLRUReplay):
        return replay_figures(replay, "lru", replay.capacity_blocks, replay.evicted, replay.oversized)
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
    prefill_chunk: int | None = None,
) -> CacheReplay | FlatBeladyReplay | FlatLRUReplay:
    """The replay of one device cache: a flat one where it gives the tree's figures (`flat`, see `simulate`),
    else a CacheReplay."""
    if flat and admission is None and not check and prefill_chunk is None:
        replay = flat_replay(
            workload,
            capacity_blocks,
            policy,
            concurrency=concurrency,
            timeline=lambda: Timeline(windows, trace_span(workload)),
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
        prefill_chunk=prefill_chunk,
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
    check_progress(progress)
    check_workload(workload)
    span = trace_span(workload)
    replay = InfiniteReplay(workload, concurrency=concurrency, windows=windows, span=span)
    drive(workload, [replay], progress)
    if replay.broken:  # ids that are not chained hashes: again, by sequence
        replay = InfiniteReplay(workload, concurrency=concurrency, chained=True, windows=windows, span=span)
        drive(workload, [replay], None)
    return replay.result()


def infinite_capacity(workload: Workload) -> int:
    """A capacity no replay of an in-memory `workload` can fill, so nothing is ever evicted."""
    return max(1, workload.total_pages)
