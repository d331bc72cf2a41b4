"""What each eviction policy costs per request in the simulator, against LRU on the same replay.

Each trace is loaded once; then, per capacity, every policy replays it `--repeats` times in turn (interleaved, so
a noisy minute hits all of them alike) and the median replay time is divided by LRU's. The replay time is what
`SimResult.seconds` measures: matching, locking, allocating (with the evictions it triggers) and inserting,
without reading the trace. Every policy runs through the radix tree (`flat=False`), LRU included. Run it alone:
two busy processes on two cores distort every ratio.

Example:
    .venv/bin/python scripts/bench_policy_cost.py ../shared/traces/mooncake_synthetic_trace.jsonl synthetic:chat
"""

from __future__ import annotations

import statistics

import click
from rich.console import Console
from rich.table import Table

from radixcache.errors import RadixCacheError
from radixcache.policy.registry import ALL_POLICIES
from radixcache.sim.simulation import simulate
from radixcache.sim.sweep import capacities_for, load_trace, parse_fractions
from radixcache.trace.stats import reuse_summary


@click.command()
@click.argument("traces", nargs=-1, required=True)
@click.option(
    "--fractions", default="0.02,0.05,0.1,0.2", show_default=True, help="Capacities, as shares of unique blocks."
)
@click.option("--policies", default="lru,reuse,cost,lfu", show_default=True, help="Policies to time (lru is the base).")
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(min=1))
@click.option("--page-size", default=16, show_default=True, type=click.IntRange(min=1), help="For token traces.")
@click.option("--block-size", default=512, show_default=True, type=click.IntRange(min=1), help="For hash traces.")
def main(traces: tuple[str, ...], fractions: str, policies: str, repeats: int, page_size: int, block_size: int) -> None:
    names = ["lru", *[p for p in policies.split(",") if p and p != "lru"]]
    unknown = [p for p in names if p not in ALL_POLICIES]
    if unknown:
        raise click.BadParameter(f"unknown policy {unknown[0]!r}; choose from {', '.join(sorted(ALL_POLICIES))}")
    try:
        fracs = parse_fractions(fractions)
    except RadixCacheError as exc:
        raise click.BadParameter(str(exc)) from None
    try:  # every trace read first: a bad one was a traceback after the ones before it had been timed (minutes)
        loaded = [load_trace(spec, page_size, block_size) for spec in traces]
    except RadixCacheError as exc:
        raise click.ClickException(str(exc)) from None
    table = Table(title=f"replay time per policy, median of {repeats}, against LRU")
    for column in ("trace", "capacity", "% of unique", *[f"{n} ms/request" for n in names], *names[1:]):
        table.add_column(column, justify="right")
    worst: dict[str, float] = {}
    for name, workload in loaded:
        requests = len(workload.requests)
        unique = max(1, reuse_summary(workload).unique_blocks)
        # capacities_for sorts and merges the capacities: each one's share is its own, not the fraction at its index
        for capacity in capacities_for(workload, fracs):
            fraction = capacity / unique
            seconds: dict[str, list[float]] = {n: [] for n in names}
            for _ in range(repeats):
                for policy in names:
                    # flat=False: every policy through the tree. On a hash trace the simulator's default replays
                    # LRU over single blocks instead (simulate_flat_lru), which would time a different data
                    # structure, not the policy.
                    seconds[policy].append(simulate(workload, capacity, policy, windows=1, flat=False).seconds)
            median = {n: statistics.median(s) for n, s in seconds.items()}
            ratios = {n: median[n] / median["lru"] for n in names[1:]}
            for n, ratio in ratios.items():
                worst[n] = max(worst.get(n, 0.0), ratio)
            table.add_row(
                name,
                f"{capacity:,}",
                f"{fraction:.0%}",
                *[f"{median[n] / requests * 1e3:.3f}" for n in names],
                *[f"{ratios[n]:.2f}x" for n in names[1:]],
            )
    console = Console()
    console.print(table)
    for n, ratio in worst.items():
        console.print(f"{n}: at most {ratio:.2f}x LRU's time per request")


if __name__ == "__main__":
    main()
