"""`radixcache simulate --replicas N`: the trace through N simulated replicas behind a router
(radixcache.sim.routing_replay), and the flags such a replay refuses."""

from __future__ import annotations

import math

import click
from rich.console import Console

from radixcache.cli.progress import progress_bar
from radixcache.cli.simulate_tables import print_json, print_routing
from radixcache.cli.simulate_trace import TraceCapacity
from radixcache.errors import RadixCacheError
from radixcache.sim.routing_replay import simulate_routing
from radixcache.sim.routing_results import DEFAULT_ROUTING_COSTS, RoutingCosts
from radixcache.sim.routing_workload import RoutedWorkload, routed_in_memory
from radixcache.sim.source import TraceSource, open_source


def check_routing_flags(
    ctx: click.Context,
    belady: bool,
    host: int | None,
    disk: int | None,
    write_policy: str | None,
    rate: float | None,
    arrivals: str | None,
) -> None:
    """Usage errors for flags a routed replay does not take."""
    refused = [
        flag
        for flag, given in (
            ("--belady", belady),
            ("--host-capacity-blocks", host is not None),
            ("--disk-capacity-blocks", disk is not None),
            ("--write-policy", write_policy is not None),
            ("--host-load-ms-per-page", ctx.params.get("host_load_ms_per_page") is not None),
            ("--disk-load-ms-per-page", ctx.params.get("disk_load_ms_per_page") is not None),
        )
        if given
    ]
    if refused:
        raise click.UsageError(
            f"{', '.join(refused)}: not with --replicas (a routed replay has no oracle bound and no tiers)"
        )
    if (
        ctx.get_parameter_source("concurrency") is not click.core.ParameterSource.DEFAULT
        and ctx.params["concurrency"] != 1
    ):
        raise click.UsageError("--concurrency: not with --replicas (each replica serves one request at a time, FIFO)")
    if arrivals is not None and rate is None:
        raise click.UsageError("--arrivals: only with --rate (without it, requests arrive at the trace's timestamps)")


def simulate_routed(
    where: TraceCapacity,
    in_memory: bool,
    replicas: int,
    router: str,
    policy: str,
    prefill_ms_per_token: float | None,
    decode_ms_per_token: float | None,
    rate: float | None,
    arrivals: str,
    seed: int,
    as_json: bool,
) -> None:
    """`simulate --replicas N`: the trace through N replicas behind `router` (radixcache.sim.routing_replay)."""
    for flag, value in (
        ("--prefill-ms-per-token", prefill_ms_per_token),
        ("--decode-ms-per-token", decode_ms_per_token),
    ):
        if value is not None and not math.isfinite(value):
            raise click.UsageError(f"{flag} must be a finite number of milliseconds, got {value}")
    if rate is not None and not math.isfinite(rate):
        raise click.UsageError(f"--rate must be a finite number of requests/s, got {rate}")
    if rate is not None and not math.isfinite(1 / rate):  # > 0 by its type; a subnormal one's gap is inf
        raise click.UsageError(f"--rate {rate} is too small: its mean gap 1/rate is not a finite time")
    d = DEFAULT_ROUTING_COSTS
    costs = RoutingCosts(
        d.prefill_ms_per_token if prefill_ms_per_token is None else prefill_ms_per_token,
        d.decode_ms_per_token if decode_ms_per_token is None else decode_ms_per_token,
    )
    try:
        source = open_source(where.trace, where.fmt, page_size=where.page_size, block_size=where.block_size)
        workload: TraceSource | RoutedWorkload = routed_in_memory(source) if in_memory else source
        blocks = where.blocks(source)
        shown = Console(stderr=True).is_terminal
        requests = len(workload.requests) if isinstance(workload, RoutedWorkload) else (source.count() if shown else 0)
        with progress_bar("routing", requests) as advance:
            result = simulate_routing(
                workload,
                replicas,
                blocks,
                router,
                policy=policy,
                costs=costs,
                rate=rate,
                arrivals=arrivals,
                seed=seed,
                progress=advance,
            )
    except RadixCacheError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        print_json(result.as_dict())
    else:
        print_routing(where.shown, result)
