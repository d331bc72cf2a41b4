#!/usr/bin/env python
"""What cache_aware's `balance` term costs and buys: the shipped router against rules that never let it send a request
away from a longer match on an idle replica, under load and with sequential arrivals.

`balance` (radixcache.router.cache_aware) adds the work a replica took lately, less the mean, to its score, so a
request whose longer match sits on a replica that took more than its share may go elsewhere, even when that replica
has nothing queued ("diverted" below: routed to a replica holding fewer of its pages than an idle one). The variants:

- `shipped`: CacheAwareRouter() as the front door and the simulator use it.
- `balance=0`: no balance term.
- `keep-idle-match`: the shipped score, but a replica with a shorter match than an idle replica's is never chosen.
- `keep-idle-session`: the shipped score, but a request whose session last ran on a replica that is idle and holds its
  longest match goes back there.

Each cell is one routed replay (radixcache.sim.routing_replay) of a trace at `--replicas` replicas, with Poisson
arrivals at the trace's acceptance rate times each `--load` (docs/routing.md), or `sequential`: even arrivals at
`--sequential-scale` of it (mostly one request in the cluster at a time). Example (docs/routing.md's figures):

  .venv/bin/python scripts/simulate_balance.py synthetic:chat synthetic:agent --replicas 2,4,16
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent))  # script_args, also when loaded by path (the tests)
from script_args import positive_numbers, replica_counts

from radixcache.errors import RadixCacheError
from radixcache.router import LoadTracker, RouteRequest, RouterIndex
from radixcache.router.base import Route
from radixcache.router.cache_aware import CacheAwareRouter, ReplicaScore
from radixcache.sim.routing_cells import load_routing_trace
from radixcache.sim.routing_replay import simulate_routing

VARIANTS = ("shipped", "balance=0", "keep-idle-match", "keep-idle-session")
# (capacity per replica, acceptance rate at 16 replicas) of docs/routing.md's acceptance table; the rate is scaled
# to the replica count, so each replica's offered load is the acceptance's
SETTINGS = {"chat": (512, 5.0), "agent": (512, 3.0), "mooncake_synthetic_trace": (1000, 0.3)}
NEVER = 1e18  # a score no replica reaches


class CountingRouter(CacheAwareRouter):
    """cache_aware under one of VARIANTS, counting the requests it diverts: routed to a replica that holds fewer of
    their pages than an idle one (nothing running there)."""

    def __init__(self, variant: str) -> None:
        if variant not in VARIANTS:
            raise click.BadParameter(f"{variant}: choose one of {', '.join(VARIANTS)}")
        super().__init__(**({"balance": 0.0} if variant == "balance=0" else {}))
        self.variant = variant
        self.routed = self.diverted = 0

    def scores(
        self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker
    ) -> list[ReplicaScore]:
        out = super().scores(request, replicas, index, loads)
        idle = max((s.matched_pages for s in out if loads.running(s.replica) == 0), default=0)
        if self.variant == "keep-idle-match" and idle:
            return [s if s.matched_pages >= idle else s._replace(score=NEVER) for s in out]
        if self.variant == "keep-idle-session" and request.session is not None:
            last = self._sessions.get(request.session)
            mine = next((s for s in out if s.replica == last), None)
            longest = max(s.matched_pages for s in out)
            if mine is not None and loads.running(mine.replica) == 0 and mine.matched_pages == longest > 0:
                return [s if s is mine else s._replace(score=NEVER) for s in out]
        return out

    def route(self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker) -> Route:
        idle = [index.matched_pages(r, request.page_keys) for r in replicas if loads.running(r) == 0]
        route = super().route(request, replicas, index, loads)
        self.routed += 1
        self.diverted += route.matched_pages < max(idle, default=0)
        return route


def cell(workload: object, replicas: int, capacity: int, rate: float, arrivals: str, variant: str) -> dict:
    router = CountingRouter(variant)
    r = simulate_routing(workload, replicas, capacity, router, rate=rate, arrivals=arrivals)  # type: ignore[arg-type]
    return {
        "hit_rate": r.hit_rate,
        "imbalance": r.imbalance,
        "ttft_p50_s": r.ttft.p50_s,
        "ttft_p99_s": r.ttft.p99_s,
        "diverted": router.diverted / max(1, router.routed),
    }


@click.command()
@click.argument("traces", nargs=-1, required=True)
@click.option(
    "--replicas", default="2,4,16", show_default=True, callback=replica_counts, help="Replica counts, comma-separated."
)
@click.option(
    "--load",
    default="1",
    show_default=True,
    callback=positive_numbers,
    help="Multiples of the acceptance rate, comma-separated.",
)
@click.option("--sequential-scale", default=0.02, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--variant", "variants", multiple=True, type=click.Choice(VARIANTS), help="Repeat; default: all.")
@click.option("--page-size", default=16, show_default=True, type=click.IntRange(min=1))
def main(
    traces: tuple[str, ...],
    replicas: list[int],
    load: list[float],
    sequential_scale: float,
    variants: tuple[str, ...],
    page_size: int,
) -> None:
    """One Markdown row per trace, replica count, arrivals and variant."""
    counts, loads = replicas, load  # checked as they were parsed (script_args): not a traceback mid-sweep
    click.echo("| trace | replicas | arrivals | variant | hit rate | imbalance | TTFT p50 | TTFT p99 | diverted |")
    click.echo("|---|---:|---|---|---:|---:|---:|---:|---:|")
    for spec in traces:
        try:
            name, workload = load_routing_trace(spec, page_size, 512)
        except RadixCacheError as exc:  # a trace that cannot be read: its message, not a traceback
            raise click.ClickException(str(exc)) from None
        if name not in SETTINGS:
            raise click.BadParameter(f"{spec}: no acceptance setting for {name!r} ({', '.join(SETTINGS)})")
        capacity, rate16 = SETTINGS[name]
        for n in counts:
            runs = [(f"x{x:g} (Poisson)", rate16 * x * n / 16, "poisson") for x in loads]
            runs.append(("sequential", rate16 * sequential_scale * n / 16, "even"))
            for label, rate, arrivals in runs:
                for variant in variants or VARIANTS:
                    c = cell(workload, n, capacity, rate, arrivals, variant)
                    click.echo(
                        f"| {Path(name).name} | {n} | {label} | {variant} | {c['hit_rate']:.2%} | {c['imbalance']:.2f}"
                        f" | {c['ttft_p50_s']:.2f} s | {c['ttft_p99_s']:.2f} s | {c['diverted']:.2%} |"
                    )


if __name__ == "__main__":
    main()
