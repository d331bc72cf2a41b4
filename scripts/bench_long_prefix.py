"""Benchmark the time to first token of a short question after a long cached prefix, on SmolLM2: a 64-token
question after a cached 4,000-token prefix against the same question length after a cached 496-token one (500
rounded down to whole pages of 16, so that both prefill exactly the 64 question tokens), and after no prefix.

    .venv/bin/python scripts/bench_long_prefix.py --threads 2           # a few minutes on 2 cores
    .venv/bin/python scripts/bench_long_prefix.py --threads 2 --quick   # smaller sizes (a smoke run)

Two ways of reading the prefix, in the same run:
- in place (now): the chunk's attention reads the prefix's pages as views of the pool (model.prefix_pages);
- gathered (before): every chunk copies its whole prefix out of the pool for every layer first (as all chunks did
  before prefix_pages; the same code with `MAX_PREFIX_RUNS = 0`, which gathers every page in one `index_select`).

One engine (cache on, `--threads` fixed: `thread_policy="fixed"`) holds both prefixes on the device. Each of
`--rounds` rounds measures every (prefix, way) pair once, in a shuffled order, each with a question never seen
before (so nothing but the prefix is cached); prints the median TTFT of each, the long/short ratio of each way
(issue 33's target: at most 1.3x read in place; a met / NOT MET line says), in place against gathered, and the
load average (the machine is shared). The same table in the process's CPU time per request: at one thread the
compute runs on the engine loop thread alone, so that figure moves less with other programs' load than the wall
time does (with more threads it counts OpenMP's spinning too).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from radixcache.runtime import Engine  # noqa: E402
from radixcache.runtime.loading import load_model  # noqa: E402
from radixcache.runtime.model import prefix_pages  # noqa: E402

WAYS = ("in place", "gathered")
TARGET = 1.3  # issue 33: long / short TTFT, the prefix read in place


def _tokens(vocab: int, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, vocab) for _ in range(n)]


def measure(
    model: Any, args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, int]]:
    vocab = model.config.vocab_size
    prefixes = {"long": _tokens(vocab, args.long, 1), "short": _tokens(vocab, args.short, 2), "none": []}
    runs_default = prefix_pages.MAX_PREFIX_RUNS
    ttft: dict[str, list[float]] = {f"{name}/{way}": [] for name in prefixes for way in WAYS if name != "none"}
    ttft["none"] = []
    cpu: dict[str, list[float]] = {key: [] for key in ttft}
    cached: dict[str, int] = {}
    seeds = iter(range(1000, 10**6))
    blocks = -(-(args.long + args.short + 8 * args.question) // args.page_size) + 64
    with Engine(
        model,
        page_size=args.page_size,
        capacity_blocks=blocks,
        threads=args.threads,
        thread_policy="fixed",
        prefill_chunk=max(512, args.question),
    ) as engine:
        for prefix in prefixes.values():  # cache the prefixes (and warm the engine up)
            if prefix:
                engine.generate(prefix, max_new_tokens=1)
            engine.generate(prefix + _tokens(vocab, args.question, next(seeds)), max_new_tokens=1)
        order = [(name, way) for name in ("long", "short") for way in WAYS] + [("none", "")]
        rng = random.Random(0)
        for _ in range(args.rounds):
            rng.shuffle(order)
            for name, way in order:
                prefix_pages.MAX_PREFIX_RUNS = runs_default if way != "gathered" else 0
                prompt = prefixes[name] + _tokens(vocab, args.question, next(seeds))
                c0 = time.process_time()
                try:
                    out = engine.generate(prompt, max_new_tokens=1)
                finally:
                    prefix_pages.MAX_PREFIX_RUNS = runs_default
                key = f"{name}/{way}" if way else name
                ttft[key].append(out.ttft_s)
                cpu[key].append(time.process_time() - c0)
                cached[key] = out.cached_tokens
                assert out.prefill_tokens == args.question, f"{key}: prefilled {out.prefill_tokens} tokens"
    return ttft, cpu, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--long", type=int, default=4000, help="tokens of the long prefix (whole pages)")
    parser.add_argument("--short", type=int, default=496, help="tokens of the short prefix (whole pages)")
    parser.add_argument("--question", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, required=True, help="torch threads (fixed for the whole run)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.quick:
        args.long, args.short, args.rounds = 1024, 128, 2
    for n in (args.long, args.short):
        if n % args.page_size:
            parser.error(f"a prefix of {n} tokens is not whole pages of {args.page_size}: its last page is recomputed")
    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    ttft, cpu, cached = measure(model, args)
    text = "\n\n".join(
        [
            f"SmolLM2 ({args.model}), cpu, {args.threads} threads (fixed), pages of {args.page_size} tokens; a "
            f"{args.question}-token question, median of {args.rounds} shuffled interleaved rounds",
            _table("TTFT ms", ttft, cached, args),
            _table("process CPU ms", cpu, cached, args),
        ]
    )
    ratio = statistics.median(ttft["long/in place"]) / statistics.median(ttft["short/in place"])
    text += (
        f"\n\nissue 33: TTFT after the cached {args.long}-token prefix is {ratio:.2f}x that after the "
        f"{args.short}-token one (read in place); target <= {TARGET}x: {'met' if ratio <= TARGET else 'NOT MET'}"
    )
    load = os.getloadavg()
    text += f"\n\nload average (1, 5, 15 min) at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        out = {"ttft": ttft, "cpu": cpu, "cached": cached, "args": vars(args)}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


def _table(what: str, runs: dict[str, list[float]], cached: dict[str, int], args: argparse.Namespace) -> str:
    """One table of medians: each (prefix, way), its ratio to the short prefix read the same way, and in place
    against gathered."""
    med = {key: statistics.median(v) for key, v in runs.items()}
    lines = [
        f"| cached prefix | prefix read | cached tokens | {what} | this / short (same way) | gathered / in place |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, n in (("long", args.long), ("short", args.short)):
        for way in WAYS:
            key = f"{name}/{way}"
            ratio = med[key] / med[f"short/{way}"]
            speedup = f"{med[f'{name}/gathered'] / med[key]:.2f}x" if way == "in place" else ""
            lines.append(f"| {n} tokens | {way} | {cached[key]} | {med[key] * 1e3:.1f} | {ratio:.2f}x | {speedup} |")
    lines.append(f"| none | | {cached['none']} | {med['none'] * 1e3:.1f} | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
