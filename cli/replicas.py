"""`--replicas`, `--router`, `--ray-address` and `--stall-timeout` for `serve` and `replay`: engine replicas on Ray
behind a router."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource
from rich.table import Table

from radixcache.router import ROUTERS
from radixcache.runtime.cluster.resend import STALL_TIMEOUT_S

if TYPE_CHECKING:
    from radixcache.runtime.cluster.front import ClusterEngine


def replica_options(func: Callable) -> Callable:
    """--replicas N, --router P, --ray-address ADDR, --stall-timeout SECONDS."""
    options = [
        click.option(
            "--replicas",
            type=click.IntRange(min=1),
            help="Run N engine replicas as Ray actors (a local Ray cluster unless --ray-address) behind one router; "
            "each gets its own CPU share and torch threads (--threads, default: cores / N).",
        ),
        click.option(
            "--router",
            default="cache_aware",
            show_default=True,
            type=click.Choice(ROUTERS),
            help="How requests are spread over --replicas (docs/routing.md).",
        ),
        click.option(
            "--ray-address",
            callback=_check_address,
            help="Join this Ray cluster instead of starting a local one (with --replicas).",
        ),
        click.option(
            "--stall-timeout",
            type=click.FloatRange(min=0, min_open=True),
            callback=_check_stall_timeout,
            metavar="SECONDS",
            help="With --replicas: a replica whose engine loop has had work and finished no step for this long counts "
            "as dead when a request is re-sent (ended for Ray to restart); keep it above the longest step, a long "
            f"prompt's prefill chunk [default: {STALL_TIMEOUT_S:g}].",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _check_address(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """An empty address is a usage error naming --ray-address (Ray's own said "Invalid address format:", no flag)."""
    if value is not None and not value.strip():
        raise click.BadParameter("an empty address: give host:port, ray://host:port or auto, or leave it out")
    return value


def _check_stall_timeout(_ctx: click.Context, _param: click.Parameter, value: float | None) -> float | None:
    """A bad-option error naming --stall-timeout for nan or inf, which click's range lets through."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number of seconds")
    return value


def check_replica_flags(replicas: int | None) -> None:
    """A usage error for --router, --ray-address or --stall-timeout without --replicas (one engine: they were
    ignored)."""
    if replicas is not None:
        return
    ctx = click.get_current_context()
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("router", "ray_address", "stall_timeout")
        if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
    ]
    if given:
        raise click.UsageError(f"{', '.join(given)}: only with --replicas N (without it, one engine serves)")


def cluster_engine(
    model: str,
    replicas: int,
    router: str,
    address: str | None,
    options: dict[str, Any],
    stall_timeout: float | None = None,
) -> ClusterEngine:
    """N replicas of `model` on Ray behind `router`, as an Engine-shaped front door (runtime.cluster.front);
    `stall_timeout`: ReplicaCluster's (None: its default)."""
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.cores import usable_cores
    from radixcache.runtime.loading import resolve_model_path

    path = resolve_model_path(model)
    options = dict(options)
    cores = usable_cores()  # the affinity's CPUs, at most the cgroup quota: not the host's (os.cpu_count)
    threads = options.pop("threads", None) or max(1, cores // replicas)
    local = address is None
    cluster = ReplicaCluster(
        path,
        replicas,
        router=router,
        engine_kwargs=options,
        threads=threads,
        cpus=cores / replicas if local else float(threads),
        address=address,
        num_cpus=max(replicas, cores) if local else None,
        stall_timeout=STALL_TIMEOUT_S if stall_timeout is None else stall_timeout,
    )
    return ClusterEngine(cluster, path)


def replica_table(engine: ClusterEngine) -> Table:
    """One row per replica: requests routed there, prompt and cached tokens, hit rate, pages in the index."""
    table = Table(title=f"{engine.cluster.router.name} over {engine.cluster.stats().replicas} replicas")
    for column in ("replica", "routed", "prompt tokens", "cached tokens", "hit rate", "indexed pages"):
        table.add_column(column, justify="right")
    for row in engine.per_replica():  # a replica that did not answer (frozen): "-" for the counts only it knows
        answered = row["prompt_tokens"] is not None
        table.add_row(
            str(row["replica"]),
            f"{row['routed']:,}",
            f"{row['prompt_tokens']:,}" if answered else "-",
            f"{row['cached_tokens']:,}" if answered else "-",
            f"{row['hit_rate']:.1%}" if answered else "-",
            f"{row['indexed_pages']:,}",
        )
    return table
