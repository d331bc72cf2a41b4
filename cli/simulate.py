"""`radixcache simulate`: replay a trace through the radix tree (no model) and report hit rates."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click
from rich.console import Console

from radixcache.cli.errors import FriendlyCommand, debug_option
from radixcache.cli.piped_trace import readable_trace, shown_name
from radixcache.cli.progress import progress_bar
from radixcache.cli.simulate_compare import compare_policies
from radixcache.cli.simulate_leases import run_leases
from radixcache.cli.simulate_routed import check_routing_flags, simulate_routed
from radixcache.cli.simulate_tables import print_json, print_report
from radixcache.cli.simulate_tiers import tier_config
from radixcache.cli.simulate_trace import trace_capacity
from radixcache.cli.simulate_unused import refuse_ignored
from radixcache.errors import RadixCacheError
from radixcache.policy.admission import ADMISSION_POLICIES
from radixcache.policy.registry import ALL_POLICIES
from radixcache.router import ROUTERS
from radixcache.sim.compare import policy_names
from radixcache.sim.evaluation import evaluate
from radixcache.sim.replay_common import Replayable
from radixcache.sim.routing_replay import MAX_SIM_REPLICAS
from radixcache.sim.routing_results import DEFAULT_ROUTING_COSTS
from radixcache.sim.routing_workload import ARRIVALS
from radixcache.sim.source import open_source, usable_cpus, worth_reading_ahead
from radixcache.sim.tiers import COST_PAGE_TOKENS, DEFAULT_TIER_COSTS, MAX_COST_MS
from radixcache.sim.timeline import MAX_WINDOWS
from radixcache.tier.tiered_cache import WRITE_POLICIES
from radixcache.trace import DEFAULT_BLOCK_SIZE, FORMATS
from radixcache.trace.workload import load_workload

SIZE = click.IntRange(min=1, max=2**63 - 1)  # a cache's size: its block ids and counters are int64


@click.command(cls=FriendlyCommand)
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Trace format (default: detect).")
@click.option(  # any case, as --policies and make_policy take it; click gives the lower-case name
    "--policy", default="lru", show_default=True, type=click.Choice(sorted(ALL_POLICIES), case_sensitive=False)
)
@click.option("--capacity-blocks", type=SIZE, help="Cache size in blocks (pages).")
@click.option("--capacity-tokens", type=SIZE, help="Cache size in tokens (rounded down to blocks).")
@click.option("--page-size", type=click.IntRange(min=1), help="Tokens per page of a token trace [default: 1].")
@click.option(
    "--block-size",
    default=DEFAULT_BLOCK_SIZE,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tokens per hash id of a Mooncake trace.",
)
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(min=1), help="Requests in flight.")
@click.option(
    "--windows",
    default=10,
    show_default=True,
    type=click.IntRange(1, MAX_WINDOWS),  # each is a row of counters: 1e20 was an internal MemoryError
    help="Hit-rate windows.",
)
@click.option(
    "--belady",
    is_flag=True,
    help="Also replay Belady's offline optimum with every page of a running request cached (the resident bound: "
    "compare policies without admission with it; device-only, as the infinite cache).",
)
@click.option(
    "--belady-admission",
    is_flag=True,
    help="Also replay Belady's offline optimum when a request's pages may skip the cache (the admission bound: "
    "compare a policy with --admission with it).",
)
@click.option(
    "--admission",
    type=click.Choice(sorted(ADMISSION_POLICIES), case_sensitive=False),  # any case, as make_admission takes it
    help="Admission policy: how many of a finished request's pages the tree adopts ('reuse' needs --policy reuse) "
    "[default: adopt all].",
)
@click.option(
    "--policies",
    "policies_spec",
    metavar="all|P1,P2,..",
    help="Compare these eviction policies ('all': every one) and both Belady bounds in one table; with "
    "--admission, each policy also runs with it.",
)
@click.option(
    "--host-capacity-blocks",
    type=SIZE,
    help="Add a host tier of N blocks under the device cache: report hits per tier and a modelled TTFT.",
)
@click.option(
    "--disk-capacity-blocks",
    type=SIZE,
    help="Add a disk tier of M blocks (under the host, or right under the device without one); every page the "
    "device adopts is written through to it.",
)
@click.option(
    "--write-policy",
    type=click.Choice(WRITE_POLICIES),
    help="When the host tier gets a copy of a device page (needs --host-capacity-blocks) [default: write_through].",
)
@click.option(
    "--prefill-ms-per-token",
    type=click.FloatRange(0, MAX_COST_MS),
    help=f"Modelled prefill cost per token missed in every tier, or with --replicas not hit in the replica "
    f"[default: {DEFAULT_TIER_COSTS.prefill_ms_per_token}].",
)
@click.option(
    "--host-load-ms-per-page",
    type=click.FloatRange(0, MAX_COST_MS),
    help=f"Modelled load of one page of {COST_PAGE_TOKENS} tokens from the host, scaled by the page's tokens "
    f"[default: {DEFAULT_TIER_COSTS.host_load_ms_per_page}].",
)
@click.option(
    "--disk-load-ms-per-page",
    type=click.FloatRange(0, MAX_COST_MS),
    help=f"Modelled load of one page of {COST_PAGE_TOKENS} tokens from the disk, scaled by the page's tokens "
    f"[default: {DEFAULT_TIER_COSTS.disk_load_ms_per_page}].",
)
@click.option(
    "--replicas",
    type=click.IntRange(1, MAX_SIM_REPLICAS),  # each holds a tree and a queue: 1e20 was an internal MemoryError
    help="Simulate N engine replicas of --capacity-blocks each behind --router, each a FIFO server: report the "
    "cluster hit rate, imbalance and a modelled TTFT with queueing (docs/routing.md).",
)
@click.option(
    "--router",
    type=click.Choice(ROUTERS),
    help="With --replicas: the routing policy [default: cache_aware].",
)
@click.option(
    "--decode-ms-per-token",
    type=click.FloatRange(0, MAX_COST_MS),
    help=f"With --replicas: modelled decode cost per output token "
    f"[default: {DEFAULT_ROUTING_COSTS.decode_ms_per_token:g}].",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    help="With --replicas: arrivals at R requests/s in the trace's order [default: the trace's timestamps].",
)
@click.option(
    "--arrivals",
    type=click.Choice(ARRIVALS),
    help="With --rate: a seeded Poisson process or evenly spaced arrivals [default: poisson].",
)
@click.option("--seed", default=0, show_default=True, type=int, help="With --replicas: seeds --rate and power_of_two.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--no-infinite",
    is_flag=True,
    help="Skip the infinite-cache bound, whose table grows with the trace's distinct pages: the replay's memory is "
    "then the cache's alone.",
)
@click.option(
    "--in-memory",
    is_flag=True,
    help="Read the whole trace first and sort it by timestamp (the default streams it: requests must be in "
    "arrival order, and memory does not grow with the trace).",
)
@click.option(
    "--honor-timestamps",
    is_flag=True,
    help="Tie the cache's clock to the trace's timestamps instead of counting accesses: a policy that measures "
    "intervals (reuse) then measures trace time. Every other policy's order, and so its figures, stay the same.",
)
@click.option(
    "--leases",
    is_flag=True,
    help="Replay the trace's lease hints (retain_for, as --record-trace writes them): each hinted request's pages "
    "are held that long after it ends, on the trace clock; without and with leases, for --policy or each of "
    "--policies. Reads the trace in memory.",
)
@click.option(
    "--lease-budget",
    default=0.5,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="With --leases: the share of the capacity leases may hold; past it the oldest gives way.",
)
@click.option(
    "--prefill-chunk",
    type=click.IntRange(min=1),
    metavar="TOKENS",
    help="Replay a recorded trace's requests as the engine gave the tree their pages while they ran: the prompt in "
    "prefill passes of TOKENS from its match, then each page the decode filled (what the reuse policy learns from; "
    "the engine's passes are 512) [default: the prompt whole at its start, the rest at its finish].",
)
@click.option(
    "--read-ahead/--no-read-ahead",
    default=None,
    help="Read a streamed trace in a second process while this one replays (not with --in-memory or --replicas) "
    "[default: on for hash or token traces of 8 MiB or more on a machine with two cores or more].",
)
@debug_option
def simulate(trace: str, **options: Any) -> None:
    """Replay TRACE through the radix tree at a capacity and eviction policy, without a model.

    Reports the hit rate (tokens and blocks), evicted blocks, the hit rate per time window, and the bounds:
    an infinite cache, and with --belady the offline optimum. Token traces (JSONL, msgpack) and Mooncake
    hash-block traces are simulated; text traces need the runtime's tokenizer. The trace is streamed: memory is
    the cache's, not the trace's (Belady's oracle keeps the pages' next uses). TRACE '-' reads stdin (a pipe is
    first copied to a temporary file: the replay reads it more than once).

    With --host-capacity-blocks and/or --disk-capacity-blocks the device cache has tiers under it: the hit rate
    is over all tiers, with the share of each tier, and a modelled TTFT (prefill per token missed, plus a load
    per page from the host or disk) is reported beside the device alone and no cache. The bounds stay device-only.

    With --replicas N the trace goes through N replicas of --capacity-blocks each (per replica), each a FIFO
    server, behind --router: the cluster hit rate, the imbalance of busy time, a modelled TTFT with queueing and
    one row per replica are reported (docs/routing.md).

    \b
    Example:
      radixcache simulate ../shared/traces/mooncake_synthetic_trace.jsonl \\
          --capacity-blocks 8000 --policy lru --belady
      radixcache simulate ../shared/traces/mooncake_synthetic_trace.jsonl \\
          --capacity-blocks 8000 --host-capacity-blocks 20000 --disk-capacity-blocks 40000
      radixcache simulate ../shared/traces/mooncake_synthetic_trace.jsonl \\
          --capacity-blocks 1000 --replicas 16 --router cache_aware --rate 0.3
      zcat trace.jsonl.gz | radixcache simulate - --capacity-blocks 8000
    """
    with readable_trace(trace) as path:
        _simulate(path, shown_name(trace), **options)


def _simulate(
    trace: str,
    name: str,
    fmt: str | None,
    policy: str,
    capacity_blocks: int | None,
    capacity_tokens: int | None,
    page_size: int | None,
    block_size: int,
    concurrency: int,
    windows: int,
    belady: bool,
    belady_admission: bool,
    admission: str | None,
    policies_spec: str | None,
    host_capacity_blocks: int | None,
    disk_capacity_blocks: int | None,
    write_policy: str | None,
    prefill_ms_per_token: float | None,
    host_load_ms_per_page: float | None,
    disk_load_ms_per_page: float | None,
    replicas: int | None,
    router: str | None,
    decode_ms_per_token: float | None,
    rate: float | None,
    arrivals: str | None,
    seed: int,
    as_json: bool,
    no_infinite: bool,
    in_memory: bool,
    honor_timestamps: bool,
    read_ahead: bool | None,
    leases: bool,
    lease_budget: float,
    prefill_chunk: int | None,
    debug: bool,
) -> None:
    """`simulate` on the file `trace`, named `name` in its output."""
    where = trace_capacity(trace, fmt, page_size, block_size, capacity_blocks, capacity_tokens, name)
    try:  # a bad --policies is a usage error (exit 2), with --leases or without, before the trace is read
        names = policy_names(policies_spec) if policies_spec is not None else [policy]
    except RadixCacheError as exc:
        raise click.UsageError(str(exc)) from None
    if leases:
        run_leases(where, names, lease_budget)
        return
    refuse_ignored(replicas, policies_spec, in_memory)
    ctx = click.get_current_context()
    routing = {"--router": router, "--decode-ms-per-token": decode_ms_per_token, "--rate": rate, "--arrivals": arrivals}
    if replicas is None:
        given = [name for name, value in routing.items() if value is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)}: only for a routed replay; add --replicas N")
    else:
        if admission or belady_admission or policies_spec is not None or honor_timestamps:
            raise click.UsageError(
                "--admission, --belady-admission, --policies and --honor-timestamps are for one cache, not --replicas"
            )
        check_routing_flags(ctx, belady, host_capacity_blocks, disk_capacity_blocks, write_policy, rate, arrivals)
        simulate_routed(
            where,
            in_memory,
            replicas,
            router or "cache_aware",
            policy,
            prefill_ms_per_token,
            decode_ms_per_token,
            rate,
            arrivals or "poisson",
            seed,
            as_json,
        )
        return
    tiers = tier_config(
        host_capacity_blocks,
        disk_capacity_blocks,
        write_policy,
        prefill_ms_per_token,
        host_load_ms_per_page,
        disk_load_ms_per_page,
    )
    if tiers is not None and (admission or belady_admission or policies_spec is not None):
        raise click.UsageError("--admission, --belady-admission and --policies simulate the device cache alone")
    if prefill_chunk is not None and (tiers is not None or admission):
        raise click.UsageError(
            "--prefill-chunk: not with tiers or --admission (the engine's commits are modelled for the device cache, "
            "where every page is adopted)"
        )
    if admission == "reuse" and policy != "reuse" and policies_spec is None:
        raise click.UsageError("--admission reuse learns from the reuse eviction policy: add --policy reuse")
    if policies_spec is not None and (belady or belady_admission):
        raise click.UsageError("--policies already includes both Belady bounds: drop --belady/--belady-admission")
    try:
        if in_memory:
            workload: Replayable = load_workload(trace, fmt, page_size=page_size, block_size=block_size)
        else:
            source = open_source(trace, fmt, page_size=page_size, block_size=block_size)
            ahead = worth_reading_ahead(source) if read_ahead is None else read_ahead
            workload = replace(source, read_ahead=ahead)
        blocks = where.blocks(workload)
        if policies_spec is not None:
            compare_policies(
                name,
                workload,
                blocks,
                names,
                admission,
                concurrency,
                not no_infinite,
                as_json,
                honor_timestamps,
            )
            return
        runs = (
            1 + belady + belady_admission
        )  # the policy and the infinite bound share one pass; each Belady has its own
        # Counting a streamed trace is one more read of it: only for a bar someone sees.
        shown = Console(stderr=True).is_terminal
        requests = len(workload.requests) if in_memory else (workload.count() if shown else 0)  # type: ignore[union-attr]
        with progress_bar("simulating", runs * requests) as advance:
            report = evaluate(
                workload,
                blocks,
                policy,
                concurrency=concurrency,
                belady=belady,
                infinite=not no_infinite,
                windows=windows,
                progress=advance,
                tiers=tiers,
                admission=admission,
                belady_admission=belady_admission,
                # The Belady replays in their own processes beside the policy's, each reading the file itself.
                parallel=not in_memory and usable_cpus() >= 2,  # the affinity's CPUs, not the host's
                honor_timestamps=honor_timestamps,
                prefill_chunk=prefill_chunk,
            )
    except RadixCacheError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        print_json(report.as_dict())
        return
    print_report(name, report)
