#!/usr/bin/env python
"""Sweep traces x routers x replica counts through the routing simulator; write CSV, a Markdown table and a plot.

Each TRACE is a trace file (token JSONL/msgpack, or a Mooncake hash-block trace) or `synthetic:KIND` (chat, agent,
rag, few-shot). Every replica is a cache of --capacity-blocks and a FIFO server; requests arrive at
--rate-per-replica times the number of replicas (so each replica's offered load stays the same along the sweep),
or at the trace's timestamps. Both options take one value for every trace, or one per trace, comma-separated.
The cells (one routed replay each) run in parallel on --workers local processes (default: every core; 1 runs
them here), or with --ray on a Ray cluster (a local one of --ray-cpus CPUs, or --ray-address).

Example (the sweep of docs/routing.md):
  .venv/bin/python scripts/simulate_routing.py ../shared/traces/mooncake_synthetic_trace.jsonl \\
      synthetic:chat synthetic:agent --capacity-blocks 1000,512,512 \\
      --rate-per-replica 0.01875,0.3125,0.1875 --out results/routing
"""

from __future__ import annotations

import dataclasses
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
from radixcache.router import ROUTERS
from radixcache.sim.routing_cells import (
    SYNTHETIC,
    RoutingCell,
    RoutingCellRunner,
    RoutingRow,
    run_routing_cells_in_processes,
    run_routing_cells_on_ray,
    start_ray,
)
from radixcache.sim.routing_replay import MAX_SIM_REPLICAS
from radixcache.sim.routing_results import DEFAULT_ROUTING_COSTS, RoutingCosts
from radixcache.sim.source import usable_cpus
from radixcache.sim.sweep import distinct_names
from radixcache.sim.tiers import MAX_COST_MS
from radixcache.trace.synthetic import GENERATORS

DEFAULT_REPLICAS = "8,16,32,64"
STYLES = {"cache_aware": {"color": "black", "linewidth": 2.2, "marker": "o"}, "sglang": {"marker": "s"}}


def per_trace(text: str | None, traces: int, what: str, cast: type) -> list:
    """One value per trace from `text`: a single value for all, or one per trace (None: None for each)."""
    if text is None:
        return [None] * traces
    try:
        values = [cast(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{what} {text!r}: expected numbers separated by commas") from None
    if not all(0 < v < math.inf for v in values):  # NaN passed `v <= 0`, and failed a worker with a traceback
        raise click.BadParameter(f"{what}: every value must be a finite number > 0")
    if len(values) == 1:
        return values * traces
    if len(values) != traces:
        raise click.BadParameter(f"{what}: give one value, or one per trace ({traces}), not {len(values)}")
    return values


def trace_name(spec: str) -> str:
    """A trace's name in the tables: the generator's kind, or the file's stem (checked to exist)."""
    if spec.startswith(SYNTHETIC):
        kind = spec[len(SYNTHETIC) :]
        if kind not in GENERATORS:
            raise click.BadParameter(f"{spec}: choose one of {SYNTHETIC}{f', {SYNTHETIC}'.join(GENERATORS)}")
        return kind
    if not Path(spec).is_file():
        raise click.BadParameter(f"{spec}: no such trace file")
    return Path(spec).stem


def make_cells(
    names: list[str], routers: list[str], replicas: list[int], capacities: list[int], rates: list[float | None]
) -> list[RoutingCell]:
    """Trace by trace (so a worker loads each trace once), then replica count, then router. Raises RadixCacheError
    for a cluster rate (per replica x replicas) that is not finite or whose mean gap 1/rate is not."""
    for rate in {r * n for r in rates if r is not None for n in replicas}:
        if not math.isfinite(rate) or not math.isfinite(1 / rate):
            raise RadixCacheError(f"--rate-per-replica: a cluster rate of {rate} requests/s has no finite arrival gap")
    return [
        RoutingCell(i, name, router, n, capacities[i], None if rates[i] is None else rates[i] * n)
        for i, name in enumerate(names)
        for n in replicas
        for router in routers
    ]


def run(cells: list[RoutingCell], runner: RoutingCellRunner, workers: int, ray: bool) -> Iterator[RoutingRow]:
    """The cells' rows in order: here (one worker), on local processes, or on Ray (started already)."""
    if ray:
        return run_routing_cells_on_ray(cells, runner, workers)
    if workers == 1:
        return (runner.run(cell) for cell in cells)
    return run_routing_cells_in_processes(cells, runner, workers)


def write_csv(rows: list[RoutingRow], path: Path) -> None:
    header = [f.name for f in dataclasses.fields(RoutingRow)]
    write_whole(path, csv_text(header, (dataclasses.astuple(row) for row in rows)))


def markdown(rows: list[RoutingRow], routers: list[str]) -> str:
    """Per trace, three tables (hit rate, imbalance, TTFT p99): a row per replica count, a column per router."""
    out = []
    by_trace: dict[str, list[RoutingRow]] = defaultdict(list)
    for row in rows:
        by_trace[row.trace].append(row)
    for trace, trace_rows in by_trace.items():
        first = trace_rows[0]
        rate = (
            "the trace's timestamps"
            if first.rate is None
            else f"{first.rate / first.replicas:g} requests/s per replica"
        )
        out.append(f"**{trace}**: {first.capacity_blocks:,} blocks per replica, arrivals at {rate}\n")
        cells: dict[int, dict[str, RoutingRow]] = defaultdict(dict)
        for r in trace_rows:
            cells[r.replicas][r.router] = r
        out.append("| replicas | " + " | ".join(f"{r} hit / imbalance / TTFT p99" for r in routers) + " |")
        out.append("|---:|" + "---:|" * len(routers))
        for n in sorted(cells):
            row = cells[n]
            best_hit = max(row[r].hit_rate for r in routers)
            values = []
            for r in routers:
                x = row[r]
                hit = f"{x.hit_rate:.1%}"
                hit = f"**{hit}**" if x.hit_rate == best_hit else hit
                values.append(f"{hit} / {x.imbalance:.2f} / {x.ttft_p99_s:,.1f} s")
            out.append(f"| {n} | " + " | ".join(values) + " |")
        out.append("")
    return "\n".join(out)


def plot(rows: list[RoutingRow], routers: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(r.trace for r in rows))
    metrics = (
        ("hit_rate", "cluster hit rate, %", 100),
        ("imbalance", "imbalance (max / mean busy)", 1),
        ("ttft_p99_s", "TTFT p99, s", 1),
    )
    fig, axes = plt.subplots(len(traces), 3, figsize=(12.6, 3.1 * len(traces)), squeeze=False)
    for row_axes, trace in zip(axes, traces, strict=True):
        trace_rows = [r for r in rows if r.trace == trace]
        for ax, (field, label, scale) in zip(row_axes, metrics, strict=True):
            for router in routers:
                pts = sorted((r.replicas, getattr(r, field) * scale) for r in trace_rows if r.router == router)
                ax.plot(*zip(*pts, strict=True), label=router, **STYLES.get(router, {"marker": "."}))
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r.replicas for r in trace_rows}))
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            if field == "ttft_p99_s":
                ax.set_yscale("log")
            ax.set_title(f"{trace}: {label}", fontsize=9)
            ax.set_xlabel("replicas")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    save_figure(fig, path, 80)
    plt.close(fig)


@click.command()
@click.argument("traces", nargs=-1, required=True)
@click.option("--router", "routers", multiple=True, type=click.Choice(ROUTERS), help="Repeat; default: every router.")
@click.option("--replicas", default=DEFAULT_REPLICAS, show_default=True, help="Replica counts, comma-separated.")
@click.option(
    "--capacity-blocks", required=True, help="Blocks per replica: one value, or one per trace (comma-separated)."
)
@click.option(
    "--rate-per-replica",
    help="Arrivals per second per replica (x replicas for the cluster): one value, or one per trace "
    "[default: the trace's timestamps].",
)
@click.option("--page-size", default=16, show_default=True, type=click.IntRange(min=1), help="Page of token traces.")
@click.option("--block-size", default=512, show_default=True, type=click.IntRange(min=1), help="Mooncake block.")
@click.option(
    "--prefill-ms-per-token",
    default=DEFAULT_ROUTING_COSTS.prefill_ms_per_token,
    show_default=True,
    type=click.FloatRange(0, MAX_COST_MS),
)
@click.option(
    "--decode-ms-per-token",
    default=DEFAULT_ROUTING_COSTS.decode_ms_per_token,
    show_default=True,
    type=click.FloatRange(0, MAX_COST_MS),
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seeds the arrivals and power_of_two.")
@click.option(
    "--workers", type=click.IntRange(min=1), help="Cells at a time, one process each [default: every core]; 1: here."
)
@click.option("--ray", "use_ray", is_flag=True, help="Run the cells as Ray actors (pip install 'radixcache[cluster]').")
@click.option("--ray-address", help="With --ray: the cluster to join (e.g. auto) [default: start a local one].")
@click.option("--ray-cpus", type=click.IntRange(min=1), help="With --ray and no address: the local cluster's CPUs.")
@click.option("--out", default="results/routing", show_default=True, type=click.Path(file_okay=False))
@click.option("--no-plot", is_flag=True, help="Skip the matplotlib plot.")
def main(
    traces: tuple[str, ...],
    routers: tuple[str, ...],
    replicas: str,
    capacity_blocks: str,
    rate_per_replica: str | None,
    page_size: int,
    block_size: int,
    prefill_ms_per_token: float,
    decode_ms_per_token: float,
    seed: int,
    workers: int | None,
    use_ray: bool,
    ray_address: str | None,
    ray_cpus: int | None,
    out: str,
    no_plot: bool,
) -> None:
    """Sweep TRACES x routers x replica counts; write routing.csv, routing.md and routing.png under --out."""
    names = list(routers) or list(ROUTERS)
    try:
        counts = sorted({int(n) for n in replicas.split(",") if n.strip()})
    except ValueError:
        raise click.BadParameter(f"--replicas {replicas!r}: expected integers like 8,16,32") from None
    if not counts or counts[0] < 1 or counts[-1] > MAX_SIM_REPLICAS:  # past it: a traceback, after the smaller cells
        raise click.BadParameter(f"--replicas: give replica counts in [1, {MAX_SIM_REPLICAS:,}]")
    capacities = per_trace(capacity_blocks, len(traces), "--capacity-blocks", int)
    rates = per_trace(rate_per_replica, len(traces), "--rate-per-replica", float)
    try:
        trace_names = distinct_names(traces, [trace_name(spec) for spec in traces])
    except RadixCacheError as exc:
        raise click.BadParameter(str(exc), param_hint="'TRACES'") from None
    try:
        costs = RoutingCosts(prefill_ms_per_token, decode_ms_per_token)
        cells = make_cells(trace_names, names, counts, capacities, rates)
        if use_ray:
            workers = min(start_ray(ray_address, ray_cpus, workers), len(cells))
        else:
            workers = min(workers or usable_cpus(), len(cells))  # the affinity's CPUs, not the host's
    except RadixCacheError as exc:
        raise click.ClickException(str(exc)) from None
    where = "Ray actors" if use_ray else "worker processes" if workers > 1 else "worker (this process)"
    out_dir = check_out(out, not no_plot)  # before the first cell: not a traceback after the last
    click.echo(f"{len(cells)} routed replays on {workers} {where}", err=True)
    runner = RoutingCellRunner(list(traces), page_size, block_size, costs, seed)
    try:  # a cell's trace that cannot be read, or a rate too small for its length, fails in the replay
        rows = collect(run(cells, runner, workers, use_ray), len(cells))
    except RadixCacheError as exc:
        raise click.ClickException(str(exc)) from None
    make_out(out_dir)
    write_csv(rows, out_dir / "routing.csv")
    table = markdown(rows, names)
    write_whole(out_dir / "routing.md", table)
    if not no_plot:
        plot(rows, names, out_dir / "routing.png")
    sys.stdout.write(table + "\n")
    click.echo(f"wrote {out_dir / 'routing.csv'}, routing.md" + ("" if no_plot else ", routing.png"), err=True)


def collect(rows: Iterator[RoutingRow], total: int) -> list[RoutingRow]:
    """The rows, under a progress bar."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    out: list[RoutingRow] = []
    with Progress(*columns, transient=True) as progress:
        task = progress.add_task("routing", total=total)
        for row in rows:
            out.append(row)
            progress.update(task, advance=1, description=f"routing {row.trace}")
    return out


if __name__ == "__main__":
    main()
