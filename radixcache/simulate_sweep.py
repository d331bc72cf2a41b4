"""Sweeps of traces x policies x capacities, with the Belady and infinite-cache bounds at each capacity."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from radixcache.simulate import BELADY, infinite_capacity, simulate
from radixcache.simulate_workload import Workload
from radixcache.trace.stats import reuse_summary

INFINITE = "infinite"


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One replay of a sweep. policy is a policy name, "belady" or "infinite"."""

    trace: str
    policy: str
    capacity_blocks: int
    capacity_fraction: float  # of the trace's unique blocks (what an infinite cache ends up holding)
    hit_rate: float
    block_hit_rate: float
    hit_tokens: int
    prompt_tokens: int
    evicted_blocks: int
    seconds: float


def capacities_for(workload: Workload, fractions: Sequence[float]) -> list[int]:
    """Capacities in blocks at the given fractions of the workload's unique blocks (at least 1 each)."""
    unique = reuse_summary(workload).unique_blocks
    return sorted({max(1, round(unique * f)) for f in fractions})


def sweep_runs(policies: Sequence[str], capacities: Sequence[int], bounds: Sequence[str] = (BELADY,)) -> int:
    """How many replays `sweep` makes (for a progress bar)."""
    return 1 + len(capacities) * (len(policies) + len(bounds))


def sweep(
    name: str,
    workload: Workload,
    policies: Sequence[str],
    capacities: Sequence[int],
    *,
    bounds: Sequence[str] = (BELADY,),
    concurrency: int = 1,
    progress: Callable[[int], None] | None = None,
) -> Iterator[SweepRow]:
    """Replay `workload` once per policy and capacity, once per oracle bound ("belady", "lru-dead") and
    capacity, and once through an infinite cache (policy "infinite")."""
    unique = max(1, reuse_summary(workload).unique_blocks)

    def row(policy: str, capacity: int, fraction: float) -> SweepRow:
        r = simulate(workload, capacity, policy, concurrency=concurrency, windows=1)
        if progress is not None:
            progress(1)
        return SweepRow(
            name,
            r.policy,
            capacity,
            fraction,
            r.hit_rate,
            r.block_hit_rate,
            r.hit_tokens,
            r.prompt_tokens,
            r.evicted_blocks,
            r.seconds,
        )

    yield replace(row("lru", infinite_capacity(workload), float("inf")), policy=INFINITE)
    for capacity in capacities:
        fraction = capacity / unique
        for bound in bounds:
            yield row(bound, capacity, fraction)
        for policy in policies:
            yield row(policy, capacity, fraction)
