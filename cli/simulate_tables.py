"""`radixcache simulate`'s tables: a replay with its bounds, its tiers, a comparison of policies, a routed replay."""

from __future__ import annotations

import json
import math
import sys

from rich.console import Console
from rich.table import Table
from rich.text import Text

from radixcache.sim.compare import ComparedRun
from radixcache.sim.results import IN_FLIGHT_NOTE, SimReport, SimResult
from radixcache.sim.routing_results import RoutingResult


def print_json(summary: dict) -> None:
    """`--json`: the summary, indented, and a newline. A figure past the doubles (a TTFT of 1e308 ms a token over
    many tokens is inf) is null: JSON has no Infinity or NaN, and strict parsers refuse them."""
    json.dump(_finite(summary), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")


def _finite(value: object) -> object:
    """`value` with every non-finite float in it (at any depth) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def print_report(trace: str, report: SimReport) -> None:
    """A replay with its bounds: one row per run; then its tiers, its hit rate per window, what admission declined
    and how many requests were larger than the cache could free."""
    r = report.result
    unit = f"{r.block_tokens} tokens" if r.block_tokens > 1 else "1 token"
    table = Table(
        title=Text(
            f"{trace}: {r.requests:,} requests, {r.prompt_tokens:,} prompt tokens, "
            f"{r.capacity_blocks:,} blocks of {unit}, concurrency {r.concurrency}"
        )
    )
    for column in ("run", "hit rate", "block hit rate", "hit tokens", "evicted blocks", "seconds"):
        table.add_column(column, justify="right")
    name = r.policy if r.tiers is None else " + ".join([r.policy, *list(r.tiers.hit_tokens)[1:]])
    rows: list[tuple[str, SimResult]] = [(name, r)]
    if report.infinite is not None:
        rows.append(("infinite cache", report.infinite))
    # With requests in flight together (concurrency, or a recorded trace's finish times) Belady is no bound.
    in_flight = any(run.in_flight for run in (report.belady, report.belady_admission) if run is not None)
    what = "heuristic" if in_flight else "bound"
    if report.belady_admission is not None:
        rows.insert(1, (f"belady with admission ({what})", report.belady_admission))
    if report.belady is not None:
        device = f"belady (device {'heuristic' if in_flight else 'optimum'})"
        rows.insert(1, (f"belady, resident ({what})" if r.tiers is None else device, report.belady))
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
    if r.tiers is not None:
        print_tiers(console, r)
    # A window no request arrived in has no hit rate ("-"): read as 0%, an idle gap looked like a cold cache.
    windows = (f"{w.hit_rate:.0%}" if w.prompt_tokens else "-" for w in r.windows)
    console.print("hit rate per window: " + " ".join(windows))
    if r.admission is not None:
        console.print(f"admission {r.admission}: {r.declined_pages:,} pages declined")
    if in_flight:
        console.print(f"requests in flight together: {IN_FLIGHT_NOTE}")
    if r.oversized_requests:
        console.print(f"{r.oversized_requests} requests were larger than the cache could free; cached in part")


def print_comparison(trace: str, rows: list[ComparedRun], blocks: int, concurrency: int) -> None:
    """`--policies`: one row per policy, bound and the infinite cache."""
    first = rows[0].result
    table = Table(title=Text(f"{trace}: {first.requests:,} requests, {blocks:,} blocks, concurrency {concurrency}"))
    table.add_column("run", no_wrap=True)
    for column in ("hit rate", "evicted", "declined", "seconds"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("what it is")
    for row in rows:
        r = row.result
        table.add_row(
            row.name,
            f"{r.hit_rate:.2%}",
            f"{r.evicted_blocks:,}" if row.kind != "infinite" else "-",
            f"{r.declined_pages:,}" if r.admission is not None else "-",
            f"{r.seconds:.2f}",
            row.label if row.kind != "policy" else "online policy",
        )
    console = Console()
    console.print(table)
    if any(row.kind == "bound" and row.result.in_flight for row in rows):
        console.print(f"requests in flight together: {IN_FLIGHT_NOTE}")


def print_tiers(console: Console, r: SimResult) -> None:
    """The tiered replay's hits per tier, and its modelled TTFT beside the device alone and no cache."""
    t = r.tiers
    assert t is not None
    tiers = Table(title=f"hits per tier (host write policy {t.write_policy})")
    for column in ("tier", "capacity blocks", "hit rate", "hit tokens", "loaded blocks", "stored", "evicted"):
        tiers.add_column(column, justify="right")
    rates = t.tier_hit_rate
    for name, hits in t.hit_tokens.items():
        stats = t.tier_stats.get(name)
        tiers.add_row(
            name,
            f"{stats.capacity if stats else r.capacity_blocks:,}",
            f"{rates[name]:.2%}",
            f"{hits:,}",
            f"{t.loaded_blocks[name]:,}" if name in t.loaded_blocks else "-",
            f"{stats.stored:,}" if stats else "-",
            f"{stats.evicted:,}" if stats else f"{r.evicted_blocks:,}",
        )
    tiers.add_row("all", "", f"{r.hit_rate:.2%}", f"{r.hit_tokens:,}", "", "", "")
    console.print(tiers)
    c = t.costs
    ttft = Table(
        title=f"modelled TTFT (prefill {c.prefill_ms_per_token:g} ms per token; a page of {t.page_tokens} tokens "
        f"loads in {c.load_s_per_page('host', t.page_tokens) * 1000:g} ms from the host, "
        f"{c.load_s_per_page('disk', t.page_tokens) * 1000:g} ms from the disk)"
    )
    for column in ("run", "hit rate", "mean (ms)", "p50 (ms)", "p99 (ms)"):
        ttft.add_column(column, justify="right")
    for name, rate, s in (
        ("no cache", 0.0, t.ttft_no_cache),
        ("device only", rates["device"], t.ttft_device_only),
        (" + ".join(t.hit_tokens), r.hit_rate, t.ttft),
    ):
        ttft.add_row(name, f"{rate:.2%}", f"{s.mean_s * 1000:,.1f}", f"{s.p50_s * 1000:,.1f}", f"{s.p99_s * 1000:,.1f}")
    console.print(ttft)


def print_routing(trace: str, r: RoutingResult) -> None:
    """A routed replay: the cluster's figures, then one row per replica."""
    c = r.costs
    arrivals = "the trace's timestamps" if r.rate is None else f"{r.rate:g} requests/s"
    console = Console()
    console.print(
        f"{trace}: {r.requests:,} requests, router {r.router}, {r.num_replicas} replicas of {r.capacity_blocks:,} "
        f"blocks ({r.block_tokens} tokens each), arrivals at {arrivals}; prefill {c.prefill_ms_per_token:g} ms and "
        f"decode {c.decode_ms_per_token:g} ms per token",
        markup=False,  # a path is text, not markup
        highlight=False,
    )
    summary = Table()
    for column in ("router", "hit rate", "imbalance", "utilisation", "TTFT p50 (s)", "TTFT p99 (s)", "TTFT mean (s)"):
        summary.add_column(column, justify="right")
    summary.add_row(
        r.router,
        f"{r.hit_rate:.2%}",
        f"{r.imbalance:.2f}",
        f"{r.utilisation:.0%}",
        f"{r.ttft.p50_s:,.2f}",
        f"{r.ttft.p99_s:,.2f}",
        f"{r.ttft.mean_s:,.2f}",
    )
    console.print(summary)
    rows = Table(title="per replica")
    for column in ("replica", "requests", "prompt tokens", "hit rate", "busy (s)", "TTFT mean (s)", "evicted blocks"):
        rows.add_column(column, justify="right")
    for rep in r.replicas:
        rows.add_row(
            str(rep.replica),
            f"{rep.requests:,}",
            f"{rep.prompt_tokens:,}",
            f"{rep.hit_rate:.2%}",
            f"{rep.busy_s:,.1f}",
            f"{rep.ttft_mean_s:,.2f}",
            f"{rep.evicted_blocks:,}",
        )
    console.print(rows)
    e = r.events
    console.print(
        f"index: {e.events:,} page events in {e.batches:,} batches ({e.events_per_s:,.0f} events/s of simulated "
        f"time), at most {e.peak_index_pages:,} pages, {e.index_memory_bytes / 2**20:,.1f} MiB at the end"
    )
