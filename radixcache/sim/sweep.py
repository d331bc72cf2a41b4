"""Sweeps of traces x policies x capacities, with the Belady and infinite-cache bounds at each capacity.

A sweep is a list of independent cells (one replay each). `sweep` runs one trace's cells in this process;
`run_cells_in_processes` and `run_cells_on_ray` run the cells of several traces in parallel, each worker
loading a trace from its spec (a path, or `synthetic:KIND`) once, so no workload is pickled per cell.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from radixcache.errors import RadixCacheError
from radixcache.sim.cell_pool import run_in_processes, run_on_ray
from radixcache.sim.results import BELADY
from radixcache.sim.simulation import infinite_capacity, simulate, simulate_infinite
from radixcache.trace import FORMAT_KINDS, detect_format
from radixcache.trace.stats import reuse_summary
from radixcache.trace.synthetic import GENERATORS
from radixcache.trace.workload import Workload, load_workload, token_workload

INFINITE = "infinite"
SYNTHETIC = "synthetic:"


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
    in_flight: bool = False  # requests were in flight together (SimResult.in_flight): Belady is then no bound


@dataclass(frozen=True, slots=True)
class SweepCell:
    """One replay to make: trace `index` of the sweep (named `name`) at one policy and capacity."""

    index: int
    name: str
    policy: str  # a policy, an oracle bound, or INFINITE (LRU at a capacity nothing fills)
    capacity_blocks: int
    capacity_fraction: float


def load_trace(spec: str, page_size: int, block_size: int) -> tuple[str, Workload]:
    """(name, workload) of a trace file or of `synthetic:KIND[@SEED]` (the generator's defaults, at `page_size`;
    with @SEED, another seed than the default 0, e.g. a held-out one)."""
    if spec.startswith(SYNTHETIC):
        kind, _, seed = spec[len(SYNTHETIC) :].partition("@")
        if kind not in GENERATORS:
            raise RadixCacheError(f"{spec}: choose one of {SYNTHETIC}{f', {SYNTHETIC}'.join(GENERATORS)}")
        # ASCII digits only: str.isdigit takes '٣' (and int() reads it as 3), a run of seed 3 under another name
        if seed and not (seed.isascii() and seed.isdigit()):
            raise RadixCacheError(f"{spec}: the seed after @ must be a non-negative integer, got {seed!r}")
        if not seed:
            return kind, token_workload(GENERATORS[kind](), page_size)
        return f"{kind}@{int(seed)}", token_workload(GENERATORS[kind](seed=int(seed)), page_size)
    fmt = detect_format(spec)
    page = None if FORMAT_KINDS[fmt] == "hash" else page_size
    return Path(spec).stem, load_workload(spec, fmt, page_size=page, block_size=block_size)


def distinct_names(specs: Sequence[str], names: Sequence[str]) -> list[str]:
    """Each trace's name in a sweep's rows, tables and plot: `names[i]` (its file's stem, or its synthetic kind), or
    `specs[i]` as given where two traces share a name (day1/trace.jsonl and day2/trace.jsonl): the tables group rows
    by name, and two traces of one name became one table, each one's cells overwriting the other's. Raises
    RadixCacheError for a spec given twice."""
    twice = [spec for spec, n in Counter(specs).items() if n > 1]
    if twice:
        raise RadixCacheError(f"{twice[0]} is given twice")
    counts = Counter(names)
    return [spec if counts[name] > 1 else name for spec, name in zip(specs, names, strict=True)]


def parse_fractions(text: str) -> list[float]:
    """A command line's capacity fractions ("0.02,0.05"): the numbers, or a RadixCacheError naming `text` unless
    there is one at least and each is a finite number > 0 (checked before a study's minutes of work, not after)."""
    try:
        fractions = [float(f) for f in text.split(",") if f.strip()]
    except ValueError:
        fractions = []
    if not fractions or not all(0 < f < math.inf for f in fractions):  # NaN too
        raise RadixCacheError(f"--fractions {text!r}: expected finite numbers > 0, like 0.05,0.1")
    return fractions


def study_fractions(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[float]:
    """A study script's `--fractions`, checked with its `--block-size` before any work: a usage error (exit 2)
    naming a bad one (they were a traceback, after minutes of fitting or replaying, or a ZeroDivisionError)."""
    if args.block_size < 1:
        parser.error(f"--block-size must be an int >= 1, got {args.block_size}")
    try:
        return parse_fractions(args.fractions)
    except RadixCacheError as exc:
        parser.error(str(exc))


def study_workload(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Workload:
    """A study script's TRACE, read at its `--block-size`: a usage error (exit 2) for a trace that cannot be read
    (naming its file:line) or that is no hash trace (the studies read Mooncake-format traces: a token trace was a
    KeyError or an IndexError from inside them, and a bad line a TraceError traceback)."""
    try:
        workload = load_workload(args.trace, block_size=args.block_size)
    except RadixCacheError as exc:
        parser.error(str(exc))
    if workload.kind != "hash":
        parser.error(f"{args.trace}: a {workload.kind} trace; these studies read a Mooncake-format hash trace")
    return workload


def capacities_for(workload: Workload, fractions: Sequence[float]) -> list[int]:
    """Capacities in blocks at the given fractions of the workload's unique blocks (at least 1 each). Raises
    RadixCacheError for a fraction that is not a finite number > 0 (NaN or inf raised from round(), and a fraction
    <= 0 became a 1-block cache labelled with its own share)."""
    for f in fractions:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < math.inf:
            raise RadixCacheError(f"a capacity fraction must be a finite number > 0, got {f!r}")
    unique = reuse_summary(workload).unique_blocks
    return sorted({max(1, round(unique * f)) for f in fractions})


def sweep_runs(policies: Sequence[str], capacities: Sequence[int], bounds: Sequence[str] = (BELADY,)) -> int:
    """How many replays `sweep` makes (for a progress bar)."""
    return 1 + len(capacities) * (len(policies) + len(bounds))


def sweep_cells(
    index: int,
    name: str,
    workload: Workload,
    policies: Sequence[str],
    capacities: Sequence[int],
    bounds: Sequence[str] = (BELADY,),
) -> list[SweepCell]:
    """The cells of one trace, in row order: the infinite cache, then per capacity the bounds and policies."""
    unique = max(1, reuse_summary(workload).unique_blocks)
    cells = [SweepCell(index, name, INFINITE, infinite_capacity(workload), float("inf"))]
    for capacity in capacities:
        for policy in [*bounds, *policies]:
            cells.append(SweepCell(index, name, policy, capacity, capacity / unique))
    return cells


def run_cell(cell: SweepCell, workload: Workload, concurrency: int = 1, honor_timestamps: bool = False) -> SweepRow:
    """Replay one cell; the same cell on the same workload gives the same row, bar `seconds`. `honor_timestamps`:
    the cache's clock follows the trace's timestamps (radixcache.sim.simulation.simulate)."""
    if cell.policy == INFINITE:  # the same figures as a tree nothing fills, in a dict (simulate_infinite)
        r = simulate_infinite(workload, concurrency=concurrency, windows=1)
    else:
        r = simulate(
            workload,
            cell.capacity_blocks,
            cell.policy,
            concurrency=concurrency,
            windows=1,
            honor_timestamps=honor_timestamps,
        )
    return SweepRow(
        cell.name,
        INFINITE if cell.policy == INFINITE else r.policy,
        cell.capacity_blocks,
        cell.capacity_fraction,
        r.hit_rate,
        r.block_hit_rate,
        r.hit_tokens,
        r.prompt_tokens,
        r.evicted_blocks,
        r.seconds,
        r.in_flight,
    )


def sweep(
    name: str,
    workload: Workload,
    policies: Sequence[str],
    capacities: Sequence[int],
    *,
    bounds: Sequence[str] = (BELADY,),
    concurrency: int = 1,
    progress: Callable[[int], None] | None = None,
    honor_timestamps: bool = False,
) -> Iterator[SweepRow]:
    """Replay `workload` once per policy and capacity, once per oracle bound ("belady", "lru-dead") and
    capacity, and once through an infinite cache (policy "infinite"), in this process."""
    for cell in sweep_cells(0, name, workload, policies, capacities, bounds):
        row = run_cell(cell, workload, concurrency, honor_timestamps)
        if progress is not None:
            progress(1)
        yield row


class CellRunner:
    """Runs cells in a worker: loads a trace from its spec on its first cell and keeps only the current one
    (cells come trace by trace, so each worker loads each trace at most once)."""

    def __init__(
        self,
        specs: Sequence[str],
        page_size: int,
        block_size: int,
        concurrency: int = 1,
        honor_timestamps: bool = False,
    ) -> None:
        self.specs = list(specs)
        self.page_size = page_size
        self.block_size = block_size
        self.concurrency = concurrency
        self.honor_timestamps = honor_timestamps
        self._index = -1
        self._workload: Workload | None = None

    @property
    def init_args(self) -> tuple:
        """The arguments that build this runner in a worker (radixcache.sim.cell_pool)."""
        return (self.specs, self.page_size, self.block_size, self.concurrency, self.honor_timestamps)

    def run(self, cell: SweepCell) -> SweepRow:
        if cell.index != self._index or self._workload is None:
            self._workload = None  # free the previous trace before loading the next
            self._workload = load_trace(self.specs[cell.index], self.page_size, self.block_size)[1]
            self._index = cell.index
        return run_cell(cell, self._workload, self.concurrency, self.honor_timestamps)


def run_cells_in_processes(cells: Sequence[SweepCell], runner: CellRunner, workers: int) -> Iterator[SweepRow]:
    """Run `cells` on `workers` fresh processes, each loading traces as `runner` says; rows in cell order."""
    return run_in_processes(cells, runner, workers)


def ray_workers(address: str | None, workers: int | None) -> int:
    """Connect to Ray (start a local instance when `address` is None); `workers`, or the cluster's CPUs."""
    import ray

    ray.init(address=address)
    return workers or max(1, int(ray.cluster_resources().get("CPU", 1)))


def run_cells_on_ray(cells: Sequence[SweepCell], runner: CellRunner, workers: int) -> Iterator[SweepRow]:
    """Run `cells` on `workers` Ray actors (one CPU each, each a CellRunner) after `ray_workers`; rows in order.

    Every node needs radixcache installed and the trace files at the same paths.
    """
    return run_on_ray(cells, runner, workers)
