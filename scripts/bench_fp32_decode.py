"""fp32 batch-1 decode against transformers and the bandwidth bound, in interleaved rounds (issue 33's fp32 target).

    .venv/bin/python scripts/bench_fp32_decode.py                       # 5 rounds, 2 threads, 64 after 512
    .venv/bin/python scripts/bench_fp32_decode.py --rounds 7 --kernels fixed --no-hf
    .venv/bin/python scripts/bench_fp32_decode.py --json fp32.json --tolerance 0.05

Each round, one after the other: the read bandwidth (runtime.machine.read_bandwidth_gbs, a 512 MB sum at the same
thread count), ours (an Engine on SmolLM2 fp32, `thread_policy="fixed"`, cache off: one request of `--tokens`
greedy tokens after a `--prompt`-token prompt, `decode_tps`), the read bandwidth again, and transformers on the
same GGUF weights (fp32, `generate(n) - generate(1)` of the same prompt: the prefill cancels). The bound of a round
is the mean of the two bandwidth readings around our decode over the bytes of weights a step reads
(runtime.doctor.weight_bytes_per_token). Ratios are per round, from numbers of the same round; the one-minute load
average is read before each round. One warm-up round is not counted. transformers is optional (`--no-hf`, or
skipped with a message if missing).

A round is *steady* when its two readings differ by at most `--tolerance` (10%) of the larger. On a shared host the
memory's speed can move between about 35 and 68 GB/s within a second: a round whose readings differ measured its
decode at some speed between them, so its ratio to the bound says little either way (a decode at the slow speed
between two fast readings reads as 53% of the bound, one at the fast speed after a slow reading as 107%). The
table marks each round; the medians are over the steady rounds, over those that read 55 GB/s or more (fast) and
under 45 (slow), and over all rounds.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# First: runtime sets libgomp's spin defaults, which only take effect if torch is not loaded yet.
import radixcache.runtime  # noqa: F401

# isort: split
import argparse
import json
import statistics
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_runtime_contenders

from radixcache.runtime import Engine
from radixcache.runtime.doctor import weight_bytes_per_token
from radixcache.runtime.loading import load_model
from radixcache.runtime.machine import STEADY_TOLERANCE, bandwidth_steady, read_bandwidth_gbs
from radixcache.runtime.model.llama import LlamaModel


def hf_decode_tps(hf: Any, ids: list[int], n: int) -> float:
    """transformers' greedy decode tok/s: generate(n) - generate(1) of the same prompt, in this round."""
    prompt = torch.tensor([ids])
    mask = torch.ones_like(prompt)

    def gen(k: int) -> float:
        t = time.perf_counter()
        with torch.inference_mode():
            hf.generate(
                prompt, attention_mask=mask, max_new_tokens=k, min_new_tokens=k, do_sample=False, pad_token_id=0
            )
        return time.perf_counter() - t

    first = gen(1)
    full = gen(n)
    return (n - 1) / (full - first) if full > first else float("nan")


def median_row(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each field's median over `rows` (ratios too: the median of the rounds' own ratios)."""
    return {k: statistics.median(row[k] for row in rows) for k in rows[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--kernels", default="auto", choices=["auto", "fixed", "retune"])
    ap.add_argument("--no-hf", action="store_true", help="skip transformers")
    ap.add_argument("--tolerance", type=float, default=STEADY_TOLERANCE, help="steady: the readings within this share")
    ap.add_argument("--json", help="write every round here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model("smollm2")
    model = LlamaModel(loaded.config, loaded.weights)
    engine = Engine(
        model, threads=args.threads, thread_policy="fixed", kernels=args.kernels, enable_cache=False, kv_memory="64MiB"
    )
    nbytes = weight_bytes_per_token(model)
    hf = None
    if not args.no_hf:
        from bench_runtime_contenders import load_hf

        loaded_hf = load_hf(loaded.source)
        hf = loaded_hf.model if loaded_hf else None
    vocab = loaded.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, min(vocab, 30000), (args.prompt,), generator=gen).tolist()
    print(
        f"# SmolLM2 fp32, {args.threads} threads (fixed), {args.tokens} tokens after {args.prompt}, "
        f"kernels {engine.kernel_plan.source}, {nbytes / 1e6:.0f} MB of weights a token"
    )
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds + 1):
        load = os.getloadavg()[0]
        before = read_bandwidth_gbs(512, threads=args.threads)
        ours = engine.generate(ids, args.tokens, ignore_eos=True, temperature=0.0).decode_tps
        after = read_bandwidth_gbs(512, threads=args.threads)
        theirs = hf_decode_tps(hf, ids, args.tokens) if hf is not None else float("nan")
        bw = (before + after) / 2
        bound = bw * 1e9 / nbytes
        row = {"load": load, "bw_before": before, "bw_after": after, "bw_gbs": bw, "bound": bound, "ours": ours}
        row |= {"hf": theirs, "of_bound": ours / bound, "vs_hf": ours / theirs}
        row["steady"] = float(bandwidth_steady(before, after, args.tolerance))
        print(
            ("warm-up " if r == 0 else f"round {r}: ") + ", ".join(f"{k} {v:.2f}" for k, v in row.items()),
            flush=True,
        )
        if r:
            rounds.append(row)
    groups = {
        "steady": [row for row in rounds if row["steady"]],
        "steady, fast (>= 55 GB/s)": [row for row in rounds if row["steady"] and row["bw_gbs"] >= 55],
        "steady, slow (< 45 GB/s)": [row for row in rounds if row["steady"] and row["bw_gbs"] < 45],
        "all": rounds,
    }
    medians = {name: median_row(rows) for name, rows in groups.items() if rows}
    print(
        "\n| round | load 1m | bandwidth GB/s (before, after) | bound tok/s | ours tok/s | HF tok/s | ours/bound "
        "| ours/HF |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    named = [(str(i) + ("" if row["steady"] else " (memory speed changed)"), row) for i, row in enumerate(rounds, 1)]
    named += [(f"**median, {name}** ({len(groups[name])})", row) for name, row in medians.items()]
    for name, row in named:
        print(
            f"| {name} | {row['load']:.2f} | {row['bw_gbs']:.1f} ({row['bw_before']:.1f}, {row['bw_after']:.1f}) | "
            f"{row['bound']:.1f} | {row['ours']:.1f} | {row['hf']:.1f} | {row['of_bound']:.2f} | {row['vs_hf']:.2f} |"
        )
    if "steady" not in medians:
        print("no steady round: every round's memory speed moved by more than the tolerance")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            out = {"settings": vars(args), "weight_bytes": nbytes, "rounds": rounds, "medians": medians}
            json.dump(out, f, indent=1)
    engine.close()


if __name__ == "__main__":
    main()
