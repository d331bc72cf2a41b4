"""`evaluate`: a policy's replay with its bounds, the infinite cache and Belady's optimum (resident, or with
admission), in as few passes over the trace as they allow."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from radixcache.policy.admission import AdmissionPolicy
from radixcache.policy.base import EvictionPolicy
from radixcache.sim.fork import ForkedCall
from radixcache.sim.infinite_replay import InfiniteReplay
from radixcache.sim.packing import RequestPacker, unpack_requests
from radixcache.sim.read_ahead import ReadAhead
from radixcache.sim.replay_common import Replayable, check_flags, check_progress, check_workload, drive, trace_span
from radixcache.sim.results import BELADY, BELADY_ADMISSION, SimReport
from radixcache.sim.simulation import (
    Replay,
    on_the_tree_if_needed,
    policy_replay,
    replay_result,
    simulate,
    simulate_infinite,
)
from radixcache.sim.tiered_replay import TieredReplay
from radixcache.sim.tiers import TierConfig


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
    prefill_chunk: int | None = None,
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
    `prefill_chunk`: the policy's replay gives the tree a recorded request's pages as the engine did (see
    `simulate`); the bounds are unchanged.

    `parallel`: the Belady replays run in forked processes beside the policy's (radixcache.sim.fork), each
    reading the trace itself; the figures are the same. For a streamed trace on a machine with cores to spare (a
    forked child copies, page by page, whatever an in-memory workload it touches shares with this process)."""
    check_flags(
        belady=belady,
        infinite=infinite,
        belady_admission=belady_admission,
        parallel=parallel,
        honor_timestamps=honor_timestamps,
        flat=flat,
    )
    check_progress(progress)
    check_workload(workload)
    options = {"concurrency": concurrency, "windows": windows, "honor_timestamps": honor_timestamps, "flat": flat}
    bound = partial(simulate, capacity_blocks=capacity_blocks, **options)
    wanted = [name for name, asked in ((BELADY, belady), (BELADY_ADMISSION, belady_admission)) if asked]
    forked = {}
    if parallel:  # started before the policy's replay, so that the children copy nothing of it
        # Each reads the trace itself (a daemonic child starts no reader of its own).
        alone = replace(workload, read_ahead=False) if getattr(workload, "read_ahead", False) else workload
        forked = {name: ForkedCall(partial(bound, alone, policy=name)) for name in wanted}
    try:
        # A spare of a policy object, for a tiered replay that may have to run again (see `_with_infinite`).
        spare = copy.deepcopy(policy) if tiers is not None and isinstance(policy, EvictionPolicy) else policy
        chunk = {} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}
        replay = policy_replay(workload, capacity_blocks, policy, tiers, admission, **options, **chunk)
        report = _with_infinite(workload, replay, spare, infinite, concurrency, windows, progress)
    except BaseException:
        for call in forked.values():
            call.cancel()
        raise
    done = {}
    for name in wanted:
        if name in forked:
            done[name] = forked[name].result()
            if progress is not None:
                progress(done[name].requests)
        else:
            done[name] = bound(workload, policy=name, progress=progress)
    return replace(report, belady=done.get(BELADY), belady_admission=done.get(BELADY_ADMISSION))


def _with_infinite(
    workload: Replayable,
    replay: Replay,
    spare: str | EvictionPolicy,
    infinite: bool,
    concurrency: int,
    windows: int,
    progress: Callable[[int], None] | None,
) -> SimReport:
    """The policy's replay, run, and the infinite bound's beside it in the same pass (see `evaluate`); a tiered
    replay keyed by hash ids runs again by blake2b hashes, with the `spare` policy, when the ids prove not chained."""
    unbounded = partial(InfiniteReplay, workload, concurrency=concurrency, windows=windows, span=trace_span(workload))
    if infinite and getattr(workload, "read_ahead", False):  # the bound replays in the reader process, for free
        stream = ReadAhead(  # type: ignore[type-var]
            replace(workload, read_ahead=False), beside=unbounded, pack=RequestPacker, unpack=unpack_requests
        )
        drive(stream, [replay], progress)
        broken, bound = stream.beside_summary
    else:
        beside = unbounded()
        drive(workload, [replay, beside] if infinite else [replay], progress)
        broken, bound = beside.summary()
    replay = on_the_tree_if_needed(replay, workload)
    if isinstance(replay, TieredReplay) and replay.key == "hash-id" and replay.any_tier and broken:
        replay = TieredReplay(
            workload,
            replay.capacity_blocks,
            spare,
            tiers=replay.config,
            concurrency=concurrency,
            windows=windows,
            key="blake2b",
            honor_timestamps=replay.honor_timestamps,
        )
        drive(workload, [replay], None)
    infinite_result = None
    if infinite and broken:
        infinite_result = simulate_infinite(workload, concurrency=concurrency, windows=windows)
    elif infinite:
        infinite_result = bound
    return SimReport(replay_result(replay), infinite_result)
