"""`radixcache demo`: a synthetic multi-turn chat workload through the tree, one table per policy."""

from __future__ import annotations

import json
import sys
import time

import click
from rich.console import Console
from rich.table import Table

from radixcache import POLICIES, RadixCache
from radixcache.cli.errors import FriendlyCommand, debug_option
from radixcache.policy.registry import ALL_POLICIES
from radixcache.trace.synthetic import multi_turn_chat


def replay_through_tree(cache: RadixCache, requests: list) -> dict:
    """Match, lock, allocate, insert prompt+reply, unlock, for each request in order. Returns a summary."""
    p = cache.page_size
    started = time.perf_counter()
    for request in requests:
        full = request.tokens + request.output_tokens
        match = cache.match_prefix(request.tokens)
        cache.lock(match.node)
        pages = -(-len(full) // p)
        new = cache.allocate(pages - len(match.blocks))
        cache.insert(full, match.blocks + new)
        if len(full) % p:
            cache.free(new[-1:])  # the unaligned tail page stays with us; a runtime would keep decoding into it
        cache.unlock(match.node)
    elapsed = time.perf_counter() - started
    stats = cache.stats
    return {
        "policy": cache.policy.name,
        "requests": stats.queries,
        "prompt_tokens": stats.query_tokens,
        "hit_tokens": stats.hit_tokens,
        "hit_rate": stats.hit_rate,
        "evicted_blocks": stats.evicted_blocks,
        "seconds": elapsed,
    }


def _check_capacity(requests: list, capacity_blocks: int, page_size: int) -> None:
    """A usage error, before any policy runs, when the longest request (prompt and reply) needs more pages than the
    cache holds: the replay stopped there, after the policies before it, with the tree's 'allocate: N blocks
    requested, but the capacity is C', naming neither the option nor the size that would do."""
    longest = max((len(r.tokens) + len(r.output_tokens) for r in requests), default=0)
    pages = -(-longest // page_size)
    if pages > capacity_blocks:
        raise click.BadParameter(
            f"{capacity_blocks:,} blocks cannot hold the workload's longest request ({longest:,} tokens: {pages:,} "
            f"pages of {page_size}); give at least {pages:,}",
            param_hint="'--capacity-blocks'",
        )


@click.command(cls=FriendlyCommand)
# The workload is held whole (replayed once per policy): 10**20 conversations never returned.
@click.option("--conversations", default=200, show_default=True, type=click.IntRange(1, 10_000))
# A size up to int64's, as `simulate` takes: the tree's memory grows with the blocks used, not with the capacity.
@click.option("--capacity-blocks", default=60_000, show_default=True, type=click.IntRange(1, 2**63 - 1))
@click.option("--page-size", default=1, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--policy",
    "policies",
    multiple=True,
    # every policy usable by name, in any case, as on simulate (make_policy takes any case)
    type=click.Choice(sorted(ALL_POLICIES), case_sensitive=False),
    help=f"Repeat to compare; default: the classic ones ({', '.join(sorted(POLICIES))}).",
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@debug_option
def demo(
    conversations: int,
    capacity_blocks: int,
    page_size: int,
    policies: tuple[str, ...],
    seed: int,
    as_json: bool,
    debug: bool,
) -> None:
    """Replay a synthetic multi-turn chat workload through the radix tree (no model) and compare policies.

    \b
    Example:
      radixcache demo --capacity-blocks 30000 --policy lru --policy slru
    """
    requests = list(multi_turn_chat(conversations=conversations, seed=seed))  # replayed once per policy
    _check_capacity(requests, capacity_blocks, page_size)
    rows = []
    for name in policies or sorted(POLICIES):
        cache = RadixCache(capacity_blocks, page_size=page_size, policy=name)
        rows.append(replay_through_tree(cache, requests))
    if as_json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    table = Table(title=f"{len(requests)} requests, capacity {capacity_blocks} blocks, page size {page_size}")
    for column in ("policy", "requests", "prompt tokens", "hit tokens", "hit rate", "evicted blocks", "req/s"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            row["policy"],
            str(row["requests"]),
            f"{row['prompt_tokens']:,}",
            f"{row['hit_tokens']:,}",
            f"{row['hit_rate']:.2%}",
            f"{row['evicted_blocks']:,}",
            f"{row['requests'] / row['seconds']:,.0f}",
        )
    Console().print(table)
