"""What `radixcache replay` shows: its progress (a bar on a terminal, lines with -v otherwise), the summary table
(one column per run, with --compare the ratios) and the verdict on the two runs' texts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from radixcache.cli.terminal import terminal_text


def text_verdict(comparison: Any) -> str:
    """Whether the two runs wrote the same texts, over the requests that ran in both: after Ctrl-C the run without
    the cache holds fewer, or none (it never started), and "identical" would claim what nothing compared."""
    mismatches, compared = comparison.text_mismatches, comparison.text_compared
    if compared == 0:
        return "not compared (no request ran in both runs)"
    same = "identical" if mismatches == 0 else f"{mismatches} requests differ"
    total = len(comparison.cached.requests)
    return same if compared == total else f"{same} (of the {compared} of {total} requests that ran in both)"


@contextmanager
def progress(total: int, verbose: bool) -> Iterator[tuple[Callable, Callable, Callable]]:
    """(start(label), on_result(record), warn(message)): a rich bar on a terminal's stderr, plain lines otherwise."""
    console = Console(stderr=True)
    state: dict[str, Any] = {}

    def describe(record: Any) -> str:  # a trace's conversation ids are its own text: no escape reaches the terminal
        if not hasattr(record, "ttft_s"):
            return terminal_text(f"{record.conversation} turn {record.turn}: skipped ({record.reason})")
        return terminal_text(
            f"{record.conversation} turn {record.turn}: {record.cached_tokens}/{record.prompt_tokens} cached, "
            f"TTFT {record.ttft_s * 1000:.0f} ms, {record.decode_tps:.1f} tok/s: {record.text!r}"
        )

    if not console.is_terminal:

        def start(label: str) -> None:
            if verbose:
                console.print(f"replaying ({label})", highlight=False)

        def on_result(record: Any) -> None:
            if verbose:
                console.print(describe(record), highlight=False, markup=False, soft_wrap=True)

        yield start, on_result, lambda message: click.echo(f"warning: {terminal_text(message)}", err=True)
        return

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:

        def start(label: str) -> None:
            state["task"] = progress.add_task(f"replaying ({label})", total=total)
            state["cached"] = state["prompt"] = 0

        def on_result(record: Any) -> None:
            if hasattr(record, "cached_tokens"):
                state["cached"] += record.cached_tokens
                state["prompt"] += record.prompt_tokens
            hit = state["cached"] / state["prompt"] if state["prompt"] else 0.0
            progress.update(state["task"], advance=1)
            label = progress.tasks[-1].description.split(" ·")[0]
            progress.update(state["task"], description=f"{label} · hit rate {hit:.0%}")
            if verbose:
                progress.console.print(describe(record), highlight=False, markup=False)

        def warn(message: str) -> None:
            progress.console.print(f"warning: {terminal_text(message)}", highlight=False, markup=False)

        yield start, on_result, warn


def summary_table(summaries: list[Any], comparison: Any = None) -> Table:
    """One column per run; with a comparison, a last column of no-cache / cache ratios."""
    first = summaries[0]
    table = Table()
    table.add_column("")
    for s in summaries:
        table.add_column(f"{s.label}{' (interrupted)' if s.interrupted else ''}", justify="right")
    if comparison is not None:
        table.add_column("no cache / cache", justify="right")

    def row(label: str, field: str, fmt: Callable[[Any], str], ratio: float | None = None) -> None:
        cells = [fmt(getattr(s, field)) for s in summaries]
        if comparison is not None:
            cells.append(f"{ratio:.2f}x" if ratio else "")
        table.add_row(label, *cells)

    ratio = comparison is not None
    ms = lambda v: f"{v * 1000:,.0f} ms"  # noqa: E731
    num = lambda v: f"{v:,}"  # noqa: E731
    uncached = summaries[1] if ratio else None

    def over(field: str) -> float | None:
        if uncached is None:
            return None
        mine = getattr(first, field)
        return getattr(uncached, field) / mine if mine else None

    row("requests", "requests", num)
    row("prompt tokens", "prompt_tokens", num)
    row("cached tokens", "cached_tokens", num)
    row("hit rate", "hit_rate", lambda v: f"{v:.1%}")
    if any(s.tiers for s in summaries):
        row("  from the device", "device_hit_tokens", num)
        row("  from the host tier", "host_hit_tokens", num)
        row("  from the disk tier", "disk_hit_tokens", num)
        row("pages found below, recomputed", "declined_pages", num)
    row("prefilled tokens", "prefill_tokens", num, over("prefill_tokens"))
    row("TTFT p50", "ttft_p50_s", ms, over("ttft_p50_s"))
    row("TTFT p90", "ttft_p90_s", ms, over("ttft_p90_s"))
    row("TTFT p99", "ttft_p99_s", ms, over("ttft_p99_s"))
    row("decode tokens/s", "decode_tps", lambda v: f"{v:.1f}", over("decode_tps"))
    row("wall time", "wall_s", lambda v: f"{v:.1f} s", over("wall_s"))
    if any(s.skipped_too_long or s.skipped_kv_full for s in summaries):
        row("skipped: too long", "skipped_too_long", num)
        row("skipped: KV full", "skipped_kv_full", num)
    return table
