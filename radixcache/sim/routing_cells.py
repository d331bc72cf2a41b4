"""The routing sweep's cells (scripts/simulate_routing.py): traces x routers x replica counts, each cell one routed
replay, run here, on local processes or on Ray (radixcache.sim.cell_pool)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from radixcache.errors import RadixCacheError
from radixcache.sim.cell_pool import run_in_processes, run_on_ray
from radixcache.sim.routing_replay import simulate_routing
from radixcache.sim.routing_results import DEFAULT_ROUTING_COSTS, RoutingCosts
from radixcache.sim.source import TraceSource, open_source
from radixcache.sim.sweep import SYNTHETIC
from radixcache.trace import FORMAT_KINDS, detect_format
from radixcache.trace.synthetic import GENERATORS
from radixcache.trace.workload import Workload, token_workload


@dataclass(frozen=True, slots=True)
class RoutingCell:
    """One routed replay of a sweep: trace `index` (named `name`) through `replicas` replicas behind `router`."""

    index: int
    name: str
    router: str
    replicas: int
    capacity_blocks: int
    rate: float | None  # requests/s for the whole cluster, None for the trace's timestamps


@dataclass(frozen=True, slots=True)
class RoutingRow:
    """One cell's figures (a row of scripts/simulate_routing.py's CSV)."""

    trace: str
    router: str
    replicas: int
    capacity_blocks: int
    rate: float | None
    requests: int
    hit_rate: float
    imbalance: float
    utilisation: float
    ttft_p50_s: float
    ttft_p99_s: float
    ttft_mean_s: float
    events_per_s: float
    peak_index_pages: int
    seconds: float


def load_routing_trace(spec: str, page_size: int, block_size: int) -> tuple[str, Workload | TraceSource]:
    """(name, workload) of a trace file (streamed, its path made absolute so other processes find it) or of
    `synthetic:KIND` (the generator's defaults in memory, at `page_size`)."""
    if spec.startswith(SYNTHETIC):
        kind = spec[len(SYNTHETIC) :]
        if kind not in GENERATORS:
            raise RadixCacheError(f"{spec}: choose one of {SYNTHETIC}{f', {SYNTHETIC}'.join(GENERATORS)}")
        return kind, token_workload(GENERATORS[kind](), page_size)
    path = Path(spec).resolve()
    page = None if FORMAT_KINDS.get(detect_format(path)) == "hash" else page_size
    return path.stem, open_source(path, page_size=page, block_size=block_size)


class RoutingCellRunner:
    """Runs cells in a worker, loading each trace from its spec on first use (synthetic workloads are kept: a
    worker runs a trace's cells one after another)."""

    def __init__(
        self,
        specs: list[str],
        page_size: int,
        block_size: int,
        costs: RoutingCosts = DEFAULT_ROUTING_COSTS,
        seed: int = 0,
    ) -> None:
        self.specs, self.page_size, self.block_size = list(specs), page_size, block_size
        self.costs, self.seed = costs, seed
        self._loaded: tuple[int, Workload | TraceSource] | None = None

    @property
    def init_args(self) -> tuple:
        """The arguments that build this runner in a worker (radixcache.sim.cell_pool)."""
        return (self.specs, self.page_size, self.block_size, self.costs, self.seed)

    def workload(self, index: int) -> Workload | TraceSource:
        if self._loaded is None or self._loaded[0] != index:
            self._loaded = None  # free the previous trace first
            self._loaded = (index, load_routing_trace(self.specs[index], self.page_size, self.block_size)[1])
        return self._loaded[1]

    def run(self, cell: RoutingCell) -> RoutingRow:
        r = simulate_routing(
            self.workload(cell.index),
            cell.replicas,
            cell.capacity_blocks,
            cell.router,
            costs=self.costs,
            rate=cell.rate,
            seed=self.seed,
        )
        return RoutingRow(
            cell.name,
            cell.router,
            cell.replicas,
            cell.capacity_blocks,
            cell.rate,
            r.requests,
            r.hit_rate,
            r.imbalance,
            r.utilisation,
            r.ttft.p50_s,
            r.ttft.p99_s,
            r.ttft.mean_s,
            r.events.events_per_s,
            r.events.peak_index_pages,
            r.seconds,
        )


def run_routing_cells_in_processes(
    cells: list[RoutingCell], runner: RoutingCellRunner, workers: int
) -> Iterator[RoutingRow]:
    """Run `cells` on `workers` fresh processes; rows in cell order."""
    return run_in_processes(cells, runner, workers)


def start_ray(address: str | None, cpus: int | None, workers: int | None) -> int:
    """Join the Ray cluster at `address`, or start a local one of `cpus` CPUs (default: every core); returns
    `workers`, or the cluster's CPUs. Raises RadixCacheError when Ray is not installed."""
    try:
        import ray
    except ImportError:
        raise RadixCacheError(
            "--ray needs Ray, which is not installed: pip install 'radixcache[cluster]' (or pip install 'ray>=2.60')"
        ) from None
    if address is not None:
        ray.init(address=address)
    else:
        ray.init(num_cpus=cpus, include_dashboard=False)
    return workers or max(1, int(ray.cluster_resources().get("CPU", 1)))


def run_routing_cells_on_ray(cells: list[RoutingCell], runner: RoutingCellRunner, workers: int) -> Iterator[RoutingRow]:
    """Run `cells` on `workers` Ray actors (one CPU each) after `start_ray`; rows in cell order. Every node needs
    radixcache installed and the trace files at the same paths."""
    return run_on_ray(cells, runner, workers)
