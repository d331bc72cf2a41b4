#!/usr/bin/env python
"""Sweep traces x eviction policies x cache capacities; write CSV, a Markdown table and a plot.

Each TRACE is a trace file (token JSONL/msgpack, or a Mooncake hash-block trace) or `synthetic:KIND` for a
seeded synthetic workload (chat, agent, rag, few-shot). Capacities are fractions of each trace's unique blocks
(what an infinite cache ends up holding), so traces of any size share one x axis. Belady's optimum and the
infinite cache are the bounds. The cells (one replay each) run in parallel: on --workers local processes
(default: every core; 1 runs them here, one after another), or with --ray as Ray actors.

Example:
  .venv/bin/python scripts/simulate_eviction.py ../shared/traces/mooncake_synthetic_trace.jsonl \\
      synthetic:chat synthetic:rag --out results/eviction
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sweep_output, also when loaded by path (the tests)
from sweep_output import check_out, csv_text, make_out, save_figure, write_whole

from radixcache.errors import RadixCacheError
from radixcache.policy.registry import ALL_POLICIES
from radixcache.sim.results import BELADY, BELADY_ADMISSION, DEAD_LRU, IN_FLIGHT_NOTE
from radixcache.sim.source import usable_cpus
from radixcache.sim.sweep import (
    INFINITE,
    SYNTHETIC,
    CellRunner,
    SweepCell,
    SweepRow,
    capacities_for,
    distinct_names,
    load_trace,
    ray_workers,
    run_cell,
    run_cells_in_processes,
    run_cells_on_ray,
    sweep_cells,
)
from radixcache.trace.synthetic import GENERATORS
from radixcache.trace.workload import Workload

DEFAULT_FRACTIONS = "0.01,0.02,0.05,0.1,0.2,0.4,0.7"
BOUND_STYLES = {
    BELADY: {"color": "black", "linestyle": "--", "linewidth": 2},
    DEAD_LRU: {"color": "gray", "linestyle": "-.", "linewidth": 1.5},
    BELADY_ADMISSION: {"color": "black", "linestyle": ":", "linewidth": 2},
}


def load(spec: str, page_size: int, block_size: int) -> tuple[str, Workload]:
    if spec.startswith(SYNTHETIC) and spec[len(SYNTHETIC) :].partition("@")[0] not in GENERATORS:
        kinds = f", {SYNTHETIC}".join(GENERATORS)
        raise click.BadParameter(f"{spec}: choose one of {SYNTHETIC}{kinds}, each with an optional @SEED")
    try:
        return load_trace(spec, page_size, block_size)
    except RadixCacheError as exc:
        raise click.ClickException(str(exc)) from None


def run(
    cells: list[SweepCell], loaded: list[tuple[str, Workload]], runner: CellRunner, workers: int, ray: bool
) -> Iterator[SweepRow]:
    """The cells' rows in order: here (one worker), on local processes, or on Ray (already initialised)."""
    if ray:
        return run_cells_on_ray(cells, runner, workers)
    if workers == 1:
        return (run_cell(cell, loaded[cell.index][1], runner.concurrency, runner.honor_timestamps) for cell in cells)
    return run_cells_in_processes(cells, runner, workers)


def write_csv(rows: list[SweepRow], path: Path) -> None:
    header = [f.name for f in dataclasses.fields(SweepRow)]
    write_whole(path, csv_text(header, (dataclasses.astuple(row) for row in rows)))


def markdown(rows: list[SweepRow], policies: list[str], bounds: list[str]) -> str:
    """One table per trace: a row per capacity, a column per policy, then the oracle bounds."""
    out = []
    by_trace: dict[str, list[SweepRow]] = defaultdict(list)
    for row in rows:
        by_trace[row.trace].append(row)
    for trace, trace_rows in by_trace.items():
        infinite = next(r for r in trace_rows if r.policy == INFINITE)
        cells: dict[int, dict[str, SweepRow]] = defaultdict(dict)
        for r in trace_rows:
            if r.policy != INFINITE:
                cells[r.capacity_blocks][r.policy] = r
        columns = [*policies, *bounds]
        out.append(f"**{trace}** (infinite cache: {infinite.hit_rate:.1%} of prompt tokens)\n")
        out.append(
            "| capacity (blocks) | % of unique | "
            + " | ".join(columns)
            + " | best online | gap LRU→Belady | share of gap the best closes |"
        )
        out.append("|---:|---:|" + "---:|" * (len(columns) + 3))
        for capacity in sorted(cells):
            row = cells[capacity]
            best = max(policies, key=lambda p: row[p].hit_rate)
            values = []
            for c in columns:
                text = f"{row[c].hit_rate:.1%}"
                values.append(f"**{text}**" if c == best else text)
            gap = (row[BELADY].hit_rate - row["lru"].hit_rate) * 100 if "lru" in row else float("nan")
            closed = (row[best].hit_rate - row["lru"].hit_rate) * 100 / gap if gap > 0.05 else float("nan")
            fraction = row[columns[0]].capacity_fraction
            out.append(
                f"| {capacity:,} | {fraction:.0%} | "
                + " | ".join(values)
                + f" | {best} | {'-' if gap != gap else f'{gap:.1f} pt'} | "  # no LRU column: no gap to read
                + ("-" if closed != closed else f"{closed:.0%}")
                + " |"
            )
        out.append("")
    return "\n".join(out)


def plot(rows: list[SweepRow], policies: list[str], bounds: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(r.trace for r in rows))
    cols = min(3, len(traces))
    nrows = -(-len(traces) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    for ax, trace in zip(axes.flat, traces, strict=False):
        trace_rows = [r for r in rows if r.trace == trace]
        for policy in [*policies, *bounds]:
            pts = sorted((r.capacity_fraction * 100, r.hit_rate * 100) for r in trace_rows if r.policy == policy)
            style = BOUND_STYLES.get(policy, {"marker": "."})
            ax.plot(*zip(*pts, strict=True), label=policy, **style)
        infinite = next(r for r in trace_rows if r.policy == INFINITE)
        ax.axhline(infinite.hit_rate * 100, color="gray", linestyle=":", label=INFINITE)
        ax.set_xscale("log")
        ax.set_title(trace, fontsize=10)
        ax.set_xlabel("capacity, % of unique blocks")
        ax.set_ylabel("hit rate, % of prompt tokens")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(traces) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    save_figure(fig, path, 80)
    plt.close(fig)


@click.command()
@click.argument("traces", nargs=-1, required=True)
@click.option("--policy", "policies", multiple=True, help="Repeat; default: every named policy.")
@click.option(
    "--fractions", default=DEFAULT_FRACTIONS, show_default=True, help="Capacities, as unique-block fractions."
)
@click.option("--page-size", default=16, show_default=True, type=click.IntRange(min=1), help="Page of token traces.")
@click.option("--block-size", default=512, show_default=True, type=click.IntRange(min=1), help="Mooncake block.")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(min=1), help="Requests in flight.")
@click.option(
    "--workers", type=click.IntRange(min=1), help="Cells at a time, one process each [default: every core]; 1: here."
)
@click.option("--ray", "use_ray", is_flag=True, help="Run the cells as Ray actors (pip install ray).")
@click.option("--ray-address", help="With --ray: the cluster to join (e.g. auto) [default: start a local one].")
@click.option("--out", default="results/eviction", show_default=True, type=click.Path(file_okay=False))
@click.option("--dead-bound", is_flag=True, help="Also replay lru-dead: LRU told which blocks are never reused.")
@click.option("--no-plot", is_flag=True, help="Skip the matplotlib plot.")
@click.option(
    "--honor-timestamps",
    is_flag=True,
    help="Tie each cache's clock to the trace's timestamps (reuse measures waits in trace time; the other "
    "policies' figures do not change).",
)
def main(
    traces: tuple[str, ...],
    policies: tuple[str, ...],
    fractions: str,
    page_size: int,
    block_size: int,
    concurrency: int,
    workers: int | None,
    use_ray: bool,
    ray_address: str | None,
    out: str,
    dead_bound: bool,
    no_plot: bool,
    honor_timestamps: bool,
) -> None:
    """Sweep TRACES x policies x capacities; write sweep.csv, sweep.md and sweep.png under --out.

    \b
    Example:
      .venv/bin/python scripts/simulate_eviction.py ../shared/traces/mooncake_synthetic_trace.jsonl synthetic:chat
    """
    # Any case, as simulate's --policies and make_policy take it: one column per policy, named in lower case.
    names = list(dict.fromkeys(p.lower() for p in policies)) or sorted(ALL_POLICIES)
    unknown = [p for p in names if p not in ALL_POLICIES]
    if unknown:
        raise click.BadParameter(f"unknown policy {unknown[0]!r}; choose from {', '.join(sorted(ALL_POLICIES))}")
    try:
        fracs = [float(f) for f in fractions.split(",") if f.strip()]
    except ValueError:
        raise click.BadParameter(f"--fractions {fractions!r}: expected numbers like 0.05,0.1") from None
    if not fracs or not all(0 < f < math.inf for f in fracs):  # NaN or inf had no capacity; <= 0 became 1 block
        raise click.BadParameter(f"--fractions {fractions!r}: expected finite numbers > 0, like 0.05,0.1")
    if use_ray and importlib.util.find_spec("ray") is None:
        raise click.ClickException("--ray needs Ray, which is not installed: pip install ray")
    bounds = [BELADY, BELADY_ADMISSION, DEAD_LRU] if dead_bound else [BELADY, BELADY_ADMISSION]
    loaded = [load(spec, page_size, block_size) for spec in traces]
    try:
        trace_names = distinct_names(traces, [name for name, _ in loaded])
    except RadixCacheError as exc:
        raise click.BadParameter(str(exc), param_hint="'TRACES'") from None
    loaded = [(name, w) for name, (_, w) in zip(trace_names, loaded, strict=True)]
    cells = [
        cell
        for index, (name, w) in enumerate(loaded)
        for cell in sweep_cells(index, name, w, names, capacities_for(w, fracs), bounds)
    ]
    workers = min(ray_workers(ray_address, workers) if use_ray else workers or usable_cpus(), len(cells))
    if workers > 1 or use_ray:
        loaded = []  # each worker loads its own copy
    where = "Ray actors" if use_ray else "worker processes" if workers > 1 else "worker (this process)"
    out_dir = check_out(out, not no_plot)  # before the first cell: not a traceback after the last
    click.echo(f"{len(cells)} replays on {workers} {where}", err=True)
    runner = CellRunner(traces, page_size, block_size, concurrency, honor_timestamps)
    rows = collect(run(cells, loaded, runner, workers, use_ray), len(cells))
    make_out(out_dir)
    write_csv(rows, out_dir / "sweep.csv")
    table = markdown(rows, names, bounds)
    if concurrency > 1:  # the Belady columns and the gap to them are then no bound
        table += f"\nConcurrency {concurrency}: {IN_FLIGHT_NOTE}.\n"
    elif any(row.in_flight for row in rows):  # a recorded trace whose requests overlap, at concurrency 1
        table += f"\nRequests in flight together (the trace's finish times): {IN_FLIGHT_NOTE}.\n"
    write_whole(out_dir / "sweep.md", table)
    if not no_plot:
        plot(rows, names, bounds, out_dir / "sweep.png")
    sys.stdout.write(table + "\n")
    click.echo(f"wrote {out_dir / 'sweep.csv'}, sweep.md" + ("" if no_plot else ", sweep.png"), err=True)


def collect(rows: Iterator[SweepRow], total: int) -> list[SweepRow]:
    """The rows, under a progress bar."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    out: list[SweepRow] = []
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task("sweeping", total=total)
        for row in rows:
            out.append(row)
            progress.update(task, advance=1, description=f"sweeping {row.trace}")
    return out


if __name__ == "__main__":
    main()
