"""`radixcache simulate --leases`: a trace's lease hints replayed (radixcache.sim.lease_replay).

A request's `retain_for` (written by `--record-trace` for requests that asked for a lease, and by the agent-session
generator) holds its pages for that many seconds of trace time after it ends, within `--lease-budget` of the
capacity; the same trace without `--leases` ignores the hints. Requests without a hint replay as usual.
"""

from __future__ import annotations

from collections.abc import Sequence

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table
from rich.text import Text

from radixcache.cli.simulate_tables import print_json
from radixcache.cli.simulate_trace import TraceCapacity
from radixcache.errors import RadixCacheError
from radixcache.sim.lease_replay import LeaseReplay
from radixcache.trace.workload import Workload, load_workload

# What --leases runs with: the trace, its reading, the cache's size, the policies and the output.
LEASE_COMPATIBLE = {
    "trace",
    "fmt",
    "policy",
    "capacity_blocks",
    "capacity_tokens",
    "page_size",
    "block_size",
    "as_json",
    "leases",
    "lease_budget",
    "in_memory",
    "policies_spec",
}


def simulate_leases(
    trace: str, workload: Workload, blocks: int, policies: Sequence[str], budget: float, as_json: bool
) -> None:
    """Each policy without leases (hints ignored) and with them, on the trace clock: hit rate, modelled TTFT p99 and
    what the leases did. `workload` is in memory (the replay needs the whole trace's hints in arrival order)."""
    hinted = sum(r.retain_for is not None for r in workload.requests)
    runs = []
    for policy in policies:
        for leases in (False, True):
            ignored = [None] * len(workload.requests)  # without leases the hints are not even told to the policy
            replay = LeaseReplay(workload, blocks, policy, () if leases else ignored, budget=budget if leases else 0.0)
            for index, request in enumerate(workload.requests):
                replay.feed(index, request)
            replay.close()
            result = replay.result()
            runs.append(
                {
                    "policy": policy,
                    "leases": leases,
                    "hit_rate": result.hit_rate,
                    "hit_tokens": result.hit_tokens,
                    "ttft_p99_ms": replay.ttft_p99_ms(),
                    "evicted_blocks": result.evicted_blocks,
                    "granted": replay.granted,
                    "expired": replay.expired,
                    "gave_way": replay.given_way,
                }
            )
    summary = {
        "capacity_blocks": blocks,
        "lease_budget": budget,
        "requests": len(workload.requests),
        "hinted_requests": hinted,
        "runs": runs,
    }
    if as_json:
        print_json(summary)
        return
    table = Table(
        title=Text(
            f"{trace}: {len(workload.requests):,} requests, {hinted:,} with a lease hint, {blocks:,} blocks, "
            f"lease budget {budget:.0%} of them"
        )
    )
    for column in ("policy", "leases", "hit rate", "TTFT p99 (ms, modelled)", "evicted", "granted/expired/gave way"):
        table.add_column(column, justify="right")
    for run in runs:
        table.add_row(
            run["policy"],
            "yes" if run["leases"] else "no",
            f"{run['hit_rate']:.2%}",
            f"{run['ttft_p99_ms']:,.1f}",
            f"{run['evicted_blocks']:,}",
            f"{run['granted']}/{run['expired']}/{run['gave_way']}" if run["leases"] else "-",
        )
    Console().print(table)


def run_leases(where: TraceCapacity, policies: list[str], budget: float) -> None:
    """`--leases`: the trace's lease hints replayed (cli/simulate_leases.py), for one cache and no other option."""
    ctx = click.get_current_context()
    others = [
        name
        for name, param in ((p.opts[0], p.name) for p in ctx.command.params if p.name and p.opts)
        if param not in LEASE_COMPATIBLE and ctx.get_parameter_source(param) is not ParameterSource.DEFAULT
    ]
    if others:
        raise click.UsageError(f"{', '.join(others)}: not with --leases (one cache, its policy and the trace's hints)")
    if ctx.params["policies_spec"] is not None and ctx.get_parameter_source("policy") is not ParameterSource.DEFAULT:
        raise click.UsageError("--policy: not used with --policies (--policies names the policies)")
    if not 0 <= budget <= 1:  # NaN passes click's FloatRange; it was the replay's error, after the trace was read
        raise click.BadParameter(f"{budget} is not a fraction in [0, 1]", param_hint="'--lease-budget'")
    try:
        workload = load_workload(where.trace, where.fmt, page_size=where.page_size, block_size=where.block_size)
        simulate_leases(where.shown, workload, where.blocks(workload), policies, budget, ctx.params["as_json"])
    except RadixCacheError as exc:
        raise click.ClickException(str(exc)) from None
