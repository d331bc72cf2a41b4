"""Benchmark the runtime on SmolLM2 on this CPU, with every baseline measured in the same run (issue 8).

    .venv/bin/python scripts/bench_runtime.py                      # everything (several minutes on 2 cores)
    .venv/bin/python scripts/bench_runtime.py --quick              # smoke run: short prompts, few tokens
    .venv/bin/python scripts/bench_runtime.py --quant none         # fp32 only (default: none,fp16,gguf)
    .venv/bin/python scripts/bench_runtime.py --no-hf --no-llama-cpp --threads 2 --json bench.json
    .venv/bin/python scripts/bench_runtime.py --only prefill,decode8  # some sections only

Interleaved rounds, and why. This 2-core VM shares its host's memory bus: the read bandwidth swings between about
28 and 55 GB/s within minutes, and every weight-streaming number moves with it. Measured one contender after the
other (llama.cpp, then transformers, then ours), baselines and ours landed in different bandwidth windows and the
ratios said nothing: one full run had ours at 0.72x transformers for a 128-token prefill, a profile of the same
two minutes later 1.44x. So everything is loaded first (transformers, llama.cpp, ours in each `--quant` mode),
and every comparison runs in rounds: in each round each contender runs once, one after the other (ours in each
mode, then transformers, then llama.cpp); one warm-up round that is not counted, then `--reps` counted rounds;
each contender's best round (least time, most tok/s) counts, and the ratios are computed from those. A slow window
then slows every contender in its round alike, and the best rounds of all contenders come from comparable windows.
The memory bandwidth is measured (a 512 MB sum) at the start of every round and printed; the JSON keeps every
round with its bandwidth and each contender's numbers ("rounds"), and each row's note gives the range in its
phase.

Measured, for each `--quant` mode of ours (fp32 weights, fp16 weights), each against the baselines in the same
rounds:
- prefill tokens/s at 128, 512 and 2048 prompt tokens: ours is `model.prefill` (cache off, chunks of 512);
  transformers is one forward of the whole prompt (`use_cache=False`, `logits_to_keep=1`: like ours it computes
  the last position's logits only); llama.cpp is `Llama.eval` of the prompt (n_batch 512) after `reset()`.
  Target (fp32): ours >= transformers at every length.
- decode at batch 1 after a 512-token prompt, through the Engine (its loop thread, the real serving path): one
  request, 64 new tokens with ignore_eos, `GenerationResult.decode_tps` (tokens after the first / time after
  the first), one run per round. Target (fp32): >= 25 tok/s.
- the raw decode step (`model.decode` on this thread, no engine) at batch 1 and 8, context 513, once through the
  decode mirror (radixcache.runtime.kv.mirror, as the Engine decodes) and once from the pages, timed in the
  same rounds as the engine runs (5 steps per round at batch 1, 3 at batch 8, after one untimed step; the
  fastest counts), so that "engine at N% of the raw step" compares numbers from the same windows.
- decode at batch 1 after a 4,000-token prompt (`decode1long`; 1,000 with --quick), where an agent's context
  lives: the attention over the context is then a large part of a step. Each of our modes through the Engine (as
  above) and llama.cpp on the same GGUF file at the same threads, in the same rounds; no transformers (its 4,000-
  token prefill each round would take minutes). No target: it reports the ratio.
- decode at batch 8, aggregate, through the Engine with the cache on: the 8 distinct 512-token prompts first run
  with max_new_tokens=1 so that their KV is in the tree; then all 8 are submitted at once, so each prefill is
  only the page-unaligned tail of its prompt. The scheduler prefills all 8 in one step (8 short prefills fit
  its per-step budget) and then decodes them together; each emits its first token in that step and they all
  finish in the same step. So the window from the last first token (max ttft_s) to the last finish (max
  latency_s) holds exactly the batch-8 decode steps, and aggregate tok/s = sum(generated - 1) / (max latency_s
  - max ttft_s): prefill is excluded as it is for batch 1. The engine's step counter checks the premise (the
  run takes exactly 64 steps); when the loop started before all 8 arrived and the prefills took k extra steps,
  8 * k tokens are left out, which makes the figure a lower bound (the row says so). One run per mode per round.
  Target (fp32): >= 100 tok/s.
- transformers decode at batch 1 after a 512-token prompt: `generate` of n tokens minus `generate` of 1 token
  (same prompt, greedy), so the prefill cancels out; both halves run in the same round, and the fastest
  generate(n) minus the fastest generate(1) counts. With `--hf-batch8` also at batch 8 (in the batch-8 rounds).
- llama.cpp (llama-cpp-python, optional): decode at batch 1 after a 512-token prompt, `Llama.eval([tok])` one
  token at a time for 64 tokens (the exact count), `reset()` and the prompt before each run. It runs the GGUF
  file as stored (SmolLM2's file is Q4_1), so it reads fewer weight bytes than any of our modes.
  Stretch target: a compressed-weight mode (fp16 or gguf here; the fastest answers it) decodes at batch 1 at
  >= llama.cpp / 1.5.
- issue 33's idle batch-1 acceptance, from the same rounds: fp32 through the Engine >= 1.5x transformers, and >= 80%
  of the bandwidth bound (each round's bound is its measured bandwidth over runtime.doctor's weight bytes a token;
  the median of the rounds' shares decides); gguf >= llama.cpp on the same file at the same threads. The Engine runs
  its default thread policy (adaptive); the row says which thread counts it ended on. Its busy-machine and
  long-prefix acceptance are scripts/bench_busy.py and scripts/bench_long_prefix.py.
- TTFT of a 2,000-token prompt whose first 1,800 tokens are cached, against the same prompt with the cache
  off (target: speedup >= 0.8 x prompt tokens / computed tokens), fp32; cache on and off alternate per round.
- one paged decode step against one contiguous-KV decode step with the same model (target: <= 1.2x), fp32,
  alternating step by step, by three paths: through the decode mirror (the Engine's path; the table shuffled, the
  one-time fill reported apart), reading allocator-order pages in place, and the gather fallback on a shuffled
  table (what runs past the mirror's memory budget).

On a shared machine noise only adds time, so the fastest round is the estimate of the cost itself.
Prints each round and each result as it comes, then one markdown table whose header gives the bandwidth range
seen; `--json PATH` writes every row with its numbers and every round. transformers and llama-cpp-python are
benchmark-only dependencies: each is skipped with a message if missing.

The parts, beside this file: bench_runtime_rounds.py (the rounds, timers, bandwidth), bench_runtime_report.py (rows),
bench_runtime_contenders.py (ours, transformers, llama.cpp, the raw decode step), bench_runtime_prefill.py
(prefill, TTFT), bench_runtime_decode.py (batch 1 and 8), bench_runtime_paged.py (paged against contiguous KV).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# First: runtime sets libgomp's spin defaults, which only take effect if torch is not loaded yet.
import radixcache.runtime  # noqa: F401

# isort: split
import argparse
import gc
import json
import time
from dataclasses import asdict
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules below

from bench_runtime_contenders import Ours, load_hf, load_llama_cpp
from bench_runtime_decode import bench_decode1, bench_decode1_long, bench_decode8
from bench_runtime_paged import bench_paged_vs_contiguous
from bench_runtime_prefill import bench_prefill, bench_ttft
from bench_runtime_report import ROWS, row
from bench_runtime_rounds import ROUNDS, Settings, cpu_name, memory_bandwidth_gbs

from radixcache.runtime.loading import load_model
from radixcache.runtime.model.llama import LlamaModel

SECTIONS = ("prefill", "decode1", "decode1long", "decode8", "ttft", "paged")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quant", default="none,fp16,gguf", help="comma list of our modes: none, fp16, gguf")
    ap.add_argument("--threads", type=int, default=0, help="threads for torch, the engine and llama.cpp (0: torch's)")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    ap.add_argument("--hf-batch8", action="store_true", help="also measure transformers decode at batch 8 (slow)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp comparison")
    ap.add_argument(
        "--reps",
        type=int,
        default=3,
        help="counted rounds per comparison, after one warm-up round (each contender's best counts)",
    )
    ap.add_argument("--decode-tokens", type=int, default=64, help="new tokens per decode measurement")
    ap.add_argument("--quick", action="store_true", help="smoke run: prefill 128 only, short prompts, 8 tokens")
    ap.add_argument("--json", metavar="PATH", help="write every row, with its numbers, to this JSON file")
    ap.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma list of the sections to run: {', '.join(SECTIONS)} (default: all)",
    )
    args = ap.parse_args()
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    if not only or only - set(SECTIONS):
        ap.error(f"--only: unknown section(s) {sorted(only - set(SECTIONS))}; choose from {', '.join(SECTIONS)}")
    args.only = only
    return args


def main() -> None:
    args = parse_args()
    modes = [m.strip() for m in args.quant.split(",") if m.strip()]
    for m in modes:
        if m not in ("none", "fp16", "gguf"):
            raise SystemExit(f"--quant: unknown mode {m!r} (none, fp16, gguf)")
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    if args.quick:
        s = Settings(threads, 1, 8, 128, (128,), 400, 360, 1, (128,), args.hf_batch8, long_prompt=1000)
    else:
        s = Settings(
            threads,
            args.reps,
            args.decode_tokens,
            512,
            (128, 512, 2048),
            2000,
            1800,
            3,
            (128, 1024, 2000),
            args.hf_batch8,
        )
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    bandwidth = memory_bandwidth_gbs()
    header: dict[str, Any] = {
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "load_average": load,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "bandwidth_gbs_start": bandwidth,
        "reps": s.reps,
        "quick": args.quick,
    }
    print(
        f"# {header['cpu']}, {os.cpu_count()} CPUs, {threads} threads, torch {torch.__version__}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, OMP_WAIT_POLICY={header['omp_wait_policy']}, "
        f"memory bandwidth {bandwidth:.1f} GB/s"
        + (" (--quick: smoke-run sizes, not the issue's)" if args.quick else ""),
        flush=True,
    )

    # Everything is loaded first, so that every comparison below can run in interleaved rounds.
    t = time.perf_counter()
    smol = load_model(args.model, keep_blocks="gguf" in modes)
    print(f"  loaded {smol.config.name} from {smol.source} in {time.perf_counter() - t:.1f} s", flush=True)
    hf = None
    if args.no_hf:
        row("transformers", "not measured", "", "--no-hf")
    else:
        t = time.perf_counter()
        hf = load_hf(smol.source)
        if hf:
            print(f"  loaded {hf.label} in {time.perf_counter() - t:.1f} s", flush=True)
    lc = None
    if args.no_llama_cpp:
        row("llama.cpp", "not measured", "", "--no-llama-cpp")
    else:
        lc = load_llama_cpp(smol.source, s)
        if lc:
            print(f"  loaded {lc.label}", flush=True)
    ours: list[Ours] = []
    for mode in modes:
        tag = "fp32" if mode == "none" else mode
        try:
            blocks = smol.blocks if mode == "gguf" else None
            ours.append(Ours(mode, LlamaModel(smol.config, smol.weights, quant=mode, blocks=blocks)))
        except ValueError as exc:
            print(f"  SKIPPED quant={mode}: {exc}")
            row(f"ours {tag}", "not measured", "", str(exc))
    gc.collect()
    vocab = smol.config.vocab_size

    if "prefill" in args.only:
        print("## prefill", flush=True)
        bench_prefill(ours, hf, lc, s, vocab)
    if "decode1" in args.only:
        print("## decode, batch 1", flush=True)
        bench_decode1(ours, hf, lc, s, vocab)
    if "decode1long" in args.only:
        print(f"## decode, batch 1, after a {s.long_prompt}-token prompt", flush=True)
        bench_decode1_long(ours, lc, s, vocab)
    if "decode8" in args.only:
        print("## decode, batch 8", flush=True)
        bench_decode8(ours, hf, s, vocab)
    fp32 = next((o for o in ours if o.mode == "none"), None)
    if {"ttft", "paged"} & args.only and fp32 is None:
        print("  (TTFT and paged-vs-contiguous rows are measured with fp32 only: add none to --quant)")
    elif {"ttft", "paged"} & args.only and fp32 is not None:
        print("## ours fp32: TTFT with the cache, paged against contiguous KV", flush=True)
        if "ttft" in args.only:
            bench_ttft(fp32.model, s)
        if "paged" in args.only:
            bench_paged_vs_contiguous(fp32.model, s)

    header["bandwidth_gbs_end"] = memory_bandwidth_gbs()
    seen = [r["bandwidth_gbs"] for r in ROUNDS] + [bandwidth, header["bandwidth_gbs_end"]]
    header["bandwidth_gbs_range"] = [min(seen), max(seen)]
    print(
        f"\nmemory bandwidth {min(seen):.1f}-{max(seen):.1f} GB/s over {len(ROUNDS)} rounds "
        f"({bandwidth:.1f} GB/s at the start, {header['bandwidth_gbs_end']:.1f} GB/s at the end); every comparison "
        f"ran interleaved: one warm-up and {s.reps} counted rounds, each contender's best round counts"
    )
    print("| metric | ours | baseline | ratio / note |")
    print("| --- | --- | --- | --- |")
    for r in ROWS:
        print(f"| {r.metric} | {r.ours} | {r.base} | {r.note} |")
    met = sum(r.note.count(": met") for r in ROWS)
    missed = [r.metric for r in ROWS if ": MISSED" in r.note]
    print(f"\ntargets: {met} met, {len(missed)} missed" + "".join(f"\n  MISSED: {m}" for m in missed))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"header": header, "rounds": ROUNDS, "rows": [asdict(r) for r in ROWS]}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
