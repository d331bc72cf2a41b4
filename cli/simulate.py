"""`radixcache simulate`: replay a trace through the radix tree (no model) and report hit rates."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from radixcache.cli.progress import progress_bar
from radixcache.errors import RadixCacheError
from radixcache.policies import ALL_POLICIES
from radixcache.simulate import Replayable, SimReport, SimResult, evaluate
from radixcache.simulate_source import open_source
from radixcache.simulate_workload import load_workload
from radixcache.trace import DEFAULT_BLOCK_SIZE, FORMATS


@click.command()
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Trace format (default: detect).")
@click.option("--policy", default="lru", show_default=True, type=click.Choice(sorted(ALL_POLICIES)))
@click.option("--capacity-blocks", type=click.IntRange(min=1), help="Cache size in blocks (pages).")
@click.option("--capacity-tokens", type=click.IntRange(min=1), help="Cache size in tokens (rounded down to blocks).")
@click.option("--page-size", type=click.IntRange(min=1), help="Tokens per page of a token trace [default: 1].")
@click.option(
    "--block-size",
    default=DEFAULT_BLOCK_SIZE,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tokens per hash id of a Mooncake trace.",
)
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(min=1), help="Requests in flight.")
@click.option("--windows", default=10, show_default=True, type=click.IntRange(min=1), help="Hit-rate windows.")
@click.option("--belady", is_flag=True, help="Also replay Belady's offline optimum (the upper bound).")
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
def simulate(
    trace: str,
    fmt: str | None,
    policy: str,
    capacity_blocks: int | None,
    capacity_tokens: int | None,
    page_size: int | None,
    block_size: int,
    concurrency: int,
    windows: int,
    belady: bool,
    as_json: bool,
    no_infinite: bool,
    in_memory: bool,
) -> None:
    """Replay TRACE through the radix tree at a capacity and eviction policy, without a model.

    Reports the hit rate (tokens and blocks), evicted blocks, the hit rate per time window, and the bounds:
    an infinite cache, and with --belady the offline optimum. Token traces (JSONL, msgpack) and Mooncake
    hash-block traces are simulated; text traces need the runtime's tokenizer. The trace is streamed: memory is
    the cache's, not the trace's (Belady's oracle keeps the pages' next uses).

    \b
    Example:
      radixcache simulate ../shared/traces/mooncake_synthetic_trace.jsonl \\
          --capacity-blocks 8000 --policy lru --belady
    """
    if (capacity_blocks is None) == (capacity_tokens is None):
        raise click.UsageError("give exactly one of --capacity-blocks and --capacity-tokens")
    try:
        if in_memory:
            workload: Replayable = load_workload(trace, fmt, page_size=page_size, block_size=block_size)
        else:
            workload = open_source(trace, fmt, page_size=page_size, block_size=block_size)
        blocks = capacity_blocks or workload.blocks_for_tokens(capacity_tokens or 0)
        if blocks < 1:
            raise click.UsageError(f"--capacity-tokens {capacity_tokens} is less than one block")
        runs = 2 if belady else 1  # the policy and the infinite bound share one pass; Belady has its own
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
            )
    except RadixCacheError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        json.dump(report.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    _print_report(trace, report)


def _print_report(trace: str, report: SimReport) -> None:
    r = report.result
    unit = f"{r.block_tokens} tokens" if r.block_tokens > 1 else "1 token"
    table = Table(
        title=f"{trace}: {r.requests:,} requests, {r.prompt_tokens:,} prompt tokens, "
        f"{r.capacity_blocks:,} blocks of {unit}, concurrency {r.concurrency}"
    )
    for column in ("run", "hit rate", "block hit rate", "hit tokens", "evicted blocks", "seconds"):
        table.add_column(column, justify="right")
    rows: list[tuple[str, SimResult]] = [(r.policy, r)]
    if report.infinite is not None:
        rows.append(("infinite cache", report.infinite))
    if report.belady is not None:
        rows.insert(1, ("belady (optimum)", report.belady))
    for name, run in rows:
        table.add_row(
            name,
            f"{run.hit_rate:.2%}",
            f"{run.block_hit_rate:.2%}",
            f"{run.hit_tokens:,}",
            f"{run.evicted_blocks:,}" if run is not report.infinite else "-",
            f"{run.seconds:.2f}",
        )
    console = Console()
    console.print(table)
    console.print("hit rate per window: " + " ".join(f"{w.hit_rate:.0%}" for w in r.windows))
    if r.oversized_requests:
        console.print(f"{r.oversized_requests} requests were larger than the cache could free; cached in part")
