"""quant="gguf" decode in each activations mode (`--modes`, the first the baseline: float32 activations on
blockdot.c, 16-bit and int8 ones on qdot.c), on SmolLM2's GGUF file (or --model PATH, e.g. a Q4_K_M file), through
the Engine, in interleaved rounds.

    .venv/bin/python scripts/bench_gguf_activations.py --rounds 5 --threads 2
    .venv/bin/python scripts/bench_gguf_activations.py --raw --rounds 5 --threads 1,2 --modes float,int16-decode

Each round runs, for each mode in turn: batch 1 (one 512-token prompt, 64 new tokens, ignore_eos; the result's
decode_tps) and batch 8 (8 distinct 512-token prompts whose KV is cached first, then all 8 at once, 64 new tokens
each; aggregate tok/s = 8 * 63 / (last finish - last first token), the window that holds only batch-8 decode
steps). One warm-up round is not counted; each kernel's best round counts (other programs only add time), and the
median is printed beside it. Threads fixed (`thread_policy="fixed"`); the load average is printed before and after.

`--raw`: the decode step alone (`model.decode` on this thread, no engine, through the decode mirror as the Engine
runs it: scripts/bench_runtime_contenders.RawStep) at batch 1 and 8, context 513, for each thread count given,
the kernels alternating in each round (5 steps per round after one untimed step; the fastest counts). Steps/s
times the batch is the tok/s a decode loop of that step would reach.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import TYPE_CHECKING

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from radixcache.runtime.model.block_names import ACTIVATIONS

if TYPE_CHECKING:
    from radixcache.runtime import Engine

# torch and the engine are imported in main(), after `--modes` is checked: a bad one is refused at once.

MODES = "float,int16-decode,int8-decode"


def batch1(engine: Engine, prompt: list[int], new: int) -> float:
    return engine.generate(prompt, new, ignore_eos=True).decode_tps


def batch8(engine: Engine, prompts: list[list[int]], new: int) -> float:
    engine.generate(prompts, 1, ignore_eos=True)  # their KV into the cache: the timed run prefills only the tails
    results = engine.generate(prompts, new, ignore_eos=True)
    window = max(r.latency_s for r in results) - max(r.ttft_s for r in results)
    return sum(len(r.token_ids) - 1 for r in results) / window


def raw(loaded: object, threads: list[int], rounds: int, modes: list[str]) -> None:
    import torch
    from bench_runtime_contenders import RawStep

    from radixcache.runtime.model.llama import LlamaModel

    models = {}
    for mode in modes:
        models[mode] = LlamaModel(
            loaded.config, loaded.weights, quant="gguf", blocks=loaded.blocks, gguf_activations=mode
        )
    steps = {(k, b): RawStep(models[k], b, 513) for k in modes for b in (1, 8)}
    base = modes[0]
    heads = " | ".join(f"{k} tok/s" for k in modes) + " | " + " | ".join(f"{k} / {base}" for k in modes[1:])
    print(f"| threads | batch | {heads} | (best of {rounds} rounds; medians in ())")
    for t in threads:
        torch.set_num_threads(t)
        for b in (1, 8):
            ms: dict[str, list[float]] = {k: [] for k in modes}
            for _ in range(rounds):
                for k in modes:
                    ms[k].append(steps[(k, b)].step_ms(5)["ms/step"])
            tps = {k: 1000 * b / min(v) for k, v in ms.items()}
            med = {k: 1000 * b / statistics.median(v) for k, v in ms.items()}
            cells = [f"{tps[k]:.1f} ({med[k]:.1f})" for k in modes]
            cells += [f"{tps[k] / tps[base]:.2f}x ({med[k] / med[base]:.2f}x)" for k in modes[1:]]
            print(f"| {t} | {b} | {' | '.join(cells)} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", default="2", help="threads; with --raw a comma-separated list")
    p.add_argument("--raw", action="store_true", help="time the decode step alone (see the module docstring)")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--modes", default=MODES, help=f"activations modes, the first the baseline [{MODES}]")
    args = p.parse_args()
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in ACTIVATIONS]
    if len(modes) < 2 or bad:
        p.error(f"--modes takes two or more of {', '.join(ACTIVATIONS)}; got {args.modes!r}")
    from radixcache.runtime import Engine
    from radixcache.runtime.loading import load_model

    print("load average before:", os.getloadavg())
    loaded = load_model(args.model, keep_blocks=True)
    if args.raw:
        raw(loaded, [int(t) for t in args.threads.split(",")], args.rounds, modes)
        print("load average after:", os.getloadavg())
        return
    args.threads = int(args.threads)
    engines = {}
    for mode in modes:
        engines[mode] = Engine(
            loaded,
            quant="gguf",
            gguf_activations=mode,
            threads=args.threads,
            thread_policy="fixed",
            kernels="fixed",
            kv_memory="512MiB",
        )
    vocab = loaded.config.vocab_size
    prompts = [[(97 * i + 31 * j) % (vocab - 200) + 100 for j in range(args.prompt)] for i in range(9)]
    rows: dict[tuple[str, int], list[float]] = {(k, b): [] for k in modes for b in (1, 8)}
    for r in range(args.rounds + 1):
        for kernel in modes:
            one = batch1(engines[kernel], prompts[8 - r % 2], args.new)
            eight = batch8(engines[kernel], [[*q[:-1], r + 7] for q in prompts[:8]], args.new)
            if r:
                rows[(kernel, 1)].append(one)
                rows[(kernel, 8)].append(eight)
            print(
                f"round {r}{' (warm-up)' if not r else ''} {kernel}: batch 1 {one:.1f} tok/s, batch 8 {eight:.1f} tok/s"
            )
    print("load average after:", os.getloadavg())
    print(f"\n| batch | kernel | best tok/s | median tok/s | (threads {args.threads}, {args.rounds} rounds)")
    for b in (1, 8):
        for kernel in modes:
            v = rows[(kernel, b)]
            print(f"| {b} | {kernel} | {max(v):.1f} | {statistics.median(v):.1f} |")
        for kernel in modes[1:]:
            ratio = max(rows[(kernel, b)]) / max(rows[(modes[0], b)])
            med = statistics.median(rows[(kernel, b)]) / statistics.median(rows[(modes[0], b)])
            print(f"| {b} | {kernel} / {modes[0]} | {ratio:.2f}x | {med:.2f}x |")


if __name__ == "__main__":
    main()
