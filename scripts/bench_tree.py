"""Benchmark the radix tree against SGLang's RadixCache on a synthetic multi-turn chat workload.

Both caches replay the same requests at the same capacity, in the same process, and do the same work per
request: match the prompt, lock the match, allocate blocks for the rest of prompt + reply (evicting when
short), insert prompt + reply, free what the tree did not take, unlock. The report is the median of several
repeats, with the throughput ratio and the hit-rate difference measured in this run.

SGLang is optional and never part of this project: install its wheel outside the repository, e.g.

    .venv/bin/python -m pip install --no-deps --target .bench/sglang sglang==0.5.23

Its radix_cache module is loaded from there with the GPU and server imports it does not need on this path
replaced by inert placeholders, and it is given a small CPU allocator of KV slots (scripts/sglang_cpu.py).

It also measures what retention marks cost (radixcache.runtime.kv.retention): the same replay through our cache
under RetentionPolicy(policy) with no marks, then with `--retention-marks` marks (the prompts of requests spread
over the workload, as the engine marks them), and prints the time ratio of the two.

Example:
    .venv/bin/python scripts/bench_tree.py --conversations 200 --capacity-tokens 60000 --page-size 1
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import types
from array import array
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from script_args import at_least  # noqa: E402
from sglang_cpu import CpuSlotAllocator, load_sglang  # noqa: E402

from radixcache import EvictionPolicy, RadixCache  # noqa: E402
from radixcache.trace.synthetic import multi_turn_chat  # noqa: E402

DEFAULT_SGLANG = REPO / ".bench" / "sglang"

# ---------------------------------------------------------------------------------------------- workload


def build_workload(conversations: int, seed: int) -> list[tuple[array, array]]:
    """(prompt, prompt + reply) per request, as int64 arrays, in arrival order.

    Both caches get the same arrays; converting them is outside the timed region.
    """
    requests = multi_turn_chat(conversations=conversations, seed=seed)
    return [(array("q", r.tokens), array("q", r.tokens + r.output_tokens)) for r in requests]


class RunResult(NamedTuple):
    """One replay through one cache."""

    requests: int
    tokens: int  # prompt + reply tokens of every request
    prompt_tokens: int
    hit_tokens: int  # prompt tokens found cached by match
    evicted_tokens: int
    seconds: float  # the replay loop only


def _totals(workload: list[tuple[array, array]]) -> tuple[int, int]:
    return sum(len(full) for _, full in workload), sum(len(prompt) for prompt, _ in workload)


# ---------------------------------------------------------------------------------------------- ours


def run_ours(
    workload: list[tuple[array, array]], capacity_tokens: int, page_size: int, policy: str | EvictionPolicy
) -> RunResult:
    cache = RadixCache(capacity_tokens // page_size, page_size=page_size, policy=policy)
    p = page_size
    gc.collect()
    started = time.perf_counter()
    for prompt, full in workload:
        match = cache.match_prefix(prompt)
        cache.lock(match.node)
        new = cache.allocate(-(-len(full) // p) - len(match.blocks))
        cache.insert(full, match.blocks + new)
        if len(full) % p:
            cache.free(new[-1:])  # the unaligned tail page stays with the caller
        cache.unlock(match.node)
    seconds = time.perf_counter() - started
    cache.check_invariants()
    stats = cache.stats
    tokens, prompt_tokens = _totals(workload)
    assert stats.query_tokens == prompt_tokens
    return RunResult(len(workload), tokens, prompt_tokens, stats.hit_tokens, stats.evicted_tokens, seconds)


# ---------------------------------------------------------------------------------------------- retention marks


def retention_marks(workload: list[tuple[array, array]], n: int) -> list[tuple[array, int]]:
    """(prompt, priority) for n requests spread evenly over the workload, priorities 1, 2, 3, 1, ..."""
    n = min(n, len(workload))
    return [(workload[i * len(workload) // n][0], 1 + i % 3) for i in range(n)]


def retention_policy(policy: str, marks: list[tuple[array, int]]) -> EvictionPolicy:
    """A fresh RetentionPolicy over `policy` holding `marks` (in namespace None, the cache's default)."""
    from radixcache.runtime.kv.retention import MAX_MARKS, RetentionPolicy

    retention = RetentionPolicy(policy)
    for tokens, priority in marks:
        retention.mark(None, tokens, priority)
    assert retention.marks == min(len(marks), MAX_MARKS)
    return retention


# ---------------------------------------------------------------------------------------------- SGLang


def run_sglang(
    radix_cache: types.ModuleType,
    workload: list[tuple[array, array]],
    capacity_tokens: int,
    page_size: int,
    policy: str,
) -> RunResult:
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    RadixKey = radix_cache.RadixKey
    p = page_size
    allocator = CpuSlotAllocator(torch, capacity_tokens // p, p)
    tree = radix_cache.RadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=allocator,
            page_size=p,
            eviction_policy=policy,
        )
    )
    hit_tokens = evicted = 0
    gc.collect()
    started = time.perf_counter()
    for prompt, full in workload:
        match = tree.match_prefix(MatchPrefixParams(key=RadixKey(prompt)))
        node = match.last_device_node
        matched = match.device_prefix_len
        hit_tokens += matched
        tree.inc_lock_ref(node)
        prefix = tree.path_device_indices(node)
        pages = -(-(len(full) - matched) // p)
        short = pages * p - allocator.available_size()
        if short > 0:
            evicted += tree.evict(EvictParams(num_tokens=short)).num_tokens_evicted
            if pages * p > allocator.available_size():
                raise RuntimeError("SGLang: out of KV slots (capacity too small for one request)")
        new = allocator.alloc_pages(pages)
        values = torch.cat([prefix, new[: len(full) - matched]])
        result = tree.insert(InsertParams(key=RadixKey(full), value=values))
        if result.prefix_len > matched:  # pages another request cached meanwhile: ours are duplicates
            allocator.free_segment(values[matched : result.prefix_len])
        aligned = len(full) // p * p
        if aligned < len(full):  # the unaligned tail page stays with the caller
            allocator.free_segment(new[aligned - matched :])
        tree.dec_lock_ref(node)
    seconds = time.perf_counter() - started
    # every slot is free or in the tree, none locked: the harness leaked nothing
    assert tree.protected_size() == 0
    assert allocator.available_size() + tree.evictable_size() == capacity_tokens // p * p
    tokens, prompt_tokens = _totals(workload)
    return RunResult(len(workload), tokens, prompt_tokens, hit_tokens, evicted, seconds)


# ---------------------------------------------------------------------------------------------- report


def summarize(runs: list[RunResult]) -> dict[str, float]:
    first = runs[0]
    seconds = statistics.median(r.seconds for r in runs)
    return {
        "requests": first.requests,
        "tokens": first.tokens,
        "seconds_median": seconds,
        "seconds_all": [round(r.seconds, 4) for r in runs],
        "requests_per_s": first.requests / seconds,
        "tokens_per_s": first.tokens / seconds,
        "hit_rate": first.hit_tokens / first.prompt_tokens,
        "evicted_tokens": first.evicted_tokens,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=at_least(1), default=200)
    parser.add_argument(
        "--capacity-tokens",
        type=at_least(1),
        default=60_000,
        help="KV capacity in tokens, the same for both caches (blocks = capacity // page size)",
    )
    parser.add_argument("--page-size", type=at_least(1), default=1)
    parser.add_argument("--policy", choices=("lru", "lfu", "fifo"), default="lru")
    parser.add_argument("--repeats", type=at_least(1), default=5, help="report the median of this many runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sglang", type=Path, default=DEFAULT_SGLANG, help="pip --target directory of sglang")
    parser.add_argument("--no-sglang", action="store_true", help="bench ours only")
    parser.add_argument(
        "--retention-marks",
        type=int,
        default=256,
        help="also time our cache under RetentionPolicy with 0 marks and with this many (0: skip)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)

    workload = build_workload(args.conversations, args.seed)
    p = args.page_size
    longest = max(len(full) for _, full in workload)
    if args.capacity_tokens // p < -(-longest // p):  # else an allocate failed with a traceback mid-replay
        parser.error(
            f"--capacity-tokens {args.capacity_tokens} cannot hold the workload's longest request ({longest} tokens "
            f"in pages of {p}); give at least {-(-longest // p) * p}"
        )
    radix_cache, sglang_note = (None, "skipped (--no-sglang)") if args.no_sglang else load_sglang(args.sglang)
    if radix_cache is None and not args.no_sglang:
        print(f"WARNING: {sglang_note}; benchmarking ours only", file=sys.stderr)

    marks = retention_marks(workload, args.retention_marks) if args.retention_marks > 0 else []
    ours_runs: list[RunResult] = []
    sglang_runs: list[RunResult] = []
    unmarked_runs: list[RunResult] = []
    marked_runs: list[RunResult] = []
    for _ in range(args.repeats):  # alternate, so all see the same machine conditions
        ours_runs.append(run_ours(workload, args.capacity_tokens, args.page_size, args.policy))
        if radix_cache is not None:
            sglang_runs.append(run_sglang(radix_cache, workload, args.capacity_tokens, args.page_size, args.policy))
        if marks:
            for runs, given in ((unmarked_runs, []), (marked_runs, marks)):
                policy = retention_policy(args.policy, given)
                runs.append(run_ours(workload, args.capacity_tokens, args.page_size, policy))

    report: dict[str, Any] = {
        "workload": {
            "conversations": args.conversations,
            "requests": len(workload),
            "tokens": _totals(workload)[0],
            "prompt_tokens": _totals(workload)[1],
            "capacity_tokens": args.capacity_tokens,
            "page_size": args.page_size,
            "policy": args.policy,
            "seed": args.seed,
            "repeats": args.repeats,
        },
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "ours": summarize(ours_runs),
        "sglang": summarize(sglang_runs) if sglang_runs else None,
        "sglang_version": sglang_note if radix_cache is not None else None,
        "sglang_note": None if radix_cache is not None else sglang_note,
    }
    if marks:
        report["retention"] = {
            "marks": len(marks),
            "mark_tokens_mean": statistics.fmean(len(tokens) for tokens, _ in marks),
            "no_marks": summarize(unmarked_runs),
            "marked": summarize(marked_runs),
        }
        report["retention"]["time_ratio"] = (
            report["retention"]["marked"]["seconds_median"] / report["retention"]["no_marks"]["seconds_median"]
        )
    if sglang_runs:
        report["throughput_ratio"] = report["ours"]["requests_per_s"] / report["sglang"]["requests_per_s"]
        # Each repeat times ours and then SGLang back to back: the ratio within one repeat, where both saw the same
        # machine, shows how much the headline (a ratio of medians) moves with the load from other work.
        pairs = zip(ours_runs, sglang_runs, strict=True)
        report["throughput_ratio_per_repeat"] = [round(theirs.seconds / mine.seconds, 3) for mine, theirs in pairs]
        report["hit_rate_diff_pp"] = 100 * (report["ours"]["hit_rate"] - report["sglang"]["hit_rate"])

    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    w = report["workload"]
    table = Table(
        title=(
            f"{w['requests']} requests ({w['conversations']} chats, {w['tokens']:,} tokens), capacity "
            f"{w['capacity_tokens']:,} tokens, page size {w['page_size']}, {w['policy']}, "
            f"median of {w['repeats']}"
        )
    )
    for column in ("cache", "req/s", "tokens/s", "hit rate", "median s"):
        table.add_column(column, justify="right")
    rows = [("radixcache", report["ours"])]
    if report["sglang"]:
        rows.append((f"SGLang {report['sglang_version']}", report["sglang"]))
    retention = report.get("retention")
    if retention:
        rows.append(("radixcache, retention, 0 marks", retention["no_marks"]))
        rows.append((f"radixcache, retention, {retention['marks']} marks", retention["marked"]))
    for name, row in rows:
        table.add_row(
            name,
            f"{row['requests_per_s']:,.0f}",
            f"{row['tokens_per_s']:,.0f}",
            f"{row['hit_rate']:.2%}",
            f"{row['seconds_median']:.3f}",
        )
    console = Console()
    console.print(table)
    if report["sglang"]:
        console.print(
            f"throughput ratio (ours / SGLang): [bold]{report['throughput_ratio']:.2f}x[/bold] "
            f"(per repeat {min(report['throughput_ratio_per_repeat']):.2f}–"
            f"{max(report['throughput_ratio_per_repeat']):.2f}x); "
            f"hit rate difference: {report['hit_rate_diff_pp']:+.2f} pp"
        )
    else:
        console.print(f"[yellow]SGLang baseline not run: {sglang_note}[/yellow]")
    if retention:
        console.print(
            f"retention marks cost ({retention['marks']} marks of {retention['mark_tokens_mean']:.0f} tokens on "
            f"average / 0 marks, time): [bold]{retention['time_ratio']:.2f}x[/bold]"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
