"""Sweep cells run in parallel, on fresh local processes or on Ray actors, each worker holding one cell runner.

A runner (radixcache.sim.sweep.CellRunner, radixcache.sim.routing_cells.RoutingCellRunner) is built again in each
worker from `init_args`, its constructor's arguments: what travels to a worker is a few paths and numbers, never a
workload, and the worker loads each trace itself. `run(cell)` returns the cell's row; rows come back in cell order.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Protocol, TypeVar

Row = TypeVar("Row")


class CellRunner(Protocol[Row]):
    """What runs cells in a worker."""

    @property
    def init_args(self) -> tuple:
        """The arguments that build the same runner in another process."""
        ...

    def run(self, cell: Any) -> Row: ...


_runner: Any = None  # a worker process's own


def _start_runner(kind: type, args: tuple) -> None:
    global _runner
    _runner = kind(*args)


def _run_in_worker(cell: Any) -> Any:
    assert _runner is not None, "the pool's initializer sets the runner"
    return _runner.run(cell)


def run_in_processes(cells: Iterable[Any], runner: CellRunner[Row], workers: int) -> Iterator[Row]:
    """Run `cells` on `workers` fresh processes, each with a runner built like `runner`; rows in cell order."""
    context = multiprocessing.get_context("spawn")  # no fork of a threaded parent (the progress bar)
    init = (type(runner), runner.init_args)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_runner, initargs=init) as pool:
        yield from pool.map(_run_in_worker, cells)


def run_on_ray(cells: Iterable[Any], runner: CellRunner[Row], workers: int) -> Iterator[Row]:
    """Run `cells` on `workers` Ray actors (one CPU each, each a runner built like `runner`) once Ray is started;
    rows in cell order; Ray is shut down at the end. Every node needs radixcache installed and the trace files at
    the same paths."""
    import ray
    from ray.util import ActorPool

    actor = ray.remote(num_cpus=1)(type(runner))
    pool = ActorPool([actor.remote(*runner.init_args) for _ in range(workers)])
    try:
        yield from pool.map(lambda a, cell: a.run.remote(cell), cells)
    finally:
        ray.shutdown()
