#!/usr/bin/env python
"""One replica at a fraction of the others' speed (a replica on a busy core): what each router gives it, and what
that costs the TTFT.

The router is told nothing of the speeds: it sees its own dispatch and finish bookkeeping (`LoadTracker.work(r)`,
the work queued on each replica), so a slow replica's queue grows and steers work away from it, while
cache_aware's `balance` term pulls towards an equal share of recent work. Each cell is one routed replay
(radixcache.sim.routing_replay, `speeds`) at the trace's acceptance setting (docs/routing.md) scaled to
`--replicas`, Poisson arrivals, replica 0 at `--slow` and the others at 1. Example (docs/routing.md's figures):

  .venv/bin/python scripts/simulate_slow_replica.py synthetic:chat synthetic:agent --replicas 2,16
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))  # script_args, also when loaded by path (the tests)
from script_args import positive_numbers, replica_counts

from radixcache.errors import RadixCacheError
from radixcache.router import make_router
from radixcache.sim.routing_cells import load_routing_trace
from radixcache.sim.routing_replay import simulate_routing

# (capacity per replica, acceptance rate at 16 replicas): docs/routing.md's acceptance table
SETTINGS = {"chat": (512, 5.0), "agent": (512, 3.0), "mooncake_synthetic_trace": (1000, 0.3)}
VARIANTS = {"cache_aware": {}, "cache_aware balance=0": {"balance": 0.0}, "least_loaded": None}


@click.command()
@click.argument("traces", nargs=-1, required=True)
@click.option(
    "--replicas", default="2,16", show_default=True, callback=replica_counts, help="Replica counts, comma-separated."
)
@click.option(
    "--slow",
    default="0.5",
    show_default=True,
    callback=positive_numbers,
    help="Replica 0's speed (the others run at 1).",
)
@click.option("--page-size", default=16, show_default=True, type=click.IntRange(min=1))
def main(traces: tuple[str, ...], replicas: list[int], slow: list[float], page_size: int) -> None:
    """One Markdown row per trace, replica count, router and speed."""
    if len(slow) != 1:
        raise click.BadParameter(f"expected one speed, got {len(slow)}", param_hint="'--slow'")
    click.echo("| trace | replicas | router | replica 0 | hit rate | TTFT p50 | TTFT p99 | replica 0's share |")
    click.echo("|---|---:|---|---:|---:|---:|---:|---:|")
    for spec in traces:
        try:
            name, workload = load_routing_trace(spec, page_size, 512)
        except RadixCacheError as exc:  # a trace that cannot be read: its message, not a traceback
            raise click.ClickException(str(exc)) from None
        if name not in SETTINGS:  # a KeyError traceback
            raise click.BadParameter(f"{spec}: no acceptance setting for {name!r} ({', '.join(SETTINGS)})")
        capacity, rate16 = SETTINGS[name]
        for n in replicas:
            for label, params in VARIANTS.items():
                for speed in (1.0, slow[0]):
                    router = make_router(label.split()[0], **params) if params is not None else label
                    speeds = (speed,) + (1.0,) * (n - 1)
                    r = simulate_routing(workload, n, capacity, router, rate=rate16 * n / 16, speeds=speeds)
                    share = r.replicas[0].requests / max(1, sum(x.requests for x in r.replicas))
                    click.echo(
                        f"| {name} | {n} | {label} | x{speed:g} | {r.hit_rate:.2%} | {r.ttft.p50_s:.2f} s "
                        f"| {r.ttft.p99_s:.2f} s | {share:.1%} |"
                    )


if __name__ == "__main__":
    main()
