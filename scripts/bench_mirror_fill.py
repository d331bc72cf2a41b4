"""A decode mirror row's fill from the pool after a prompt: one native call against PyTorch's copy per layer, on an
idle machine and beside busy programs.

    .venv/bin/python scripts/bench_mirror_fill.py                          # 512 and 4,000 positions, 0 and 2 busy
    .venv/bin/python scripts/bench_mirror_fill.py --positions 2000 --busy 1 --rounds 5 --threads 1
    .venv/bin/python scripts/bench_mirror_fill.py --engine --quant gguf      # inside a real Engine's steps

When a sequence joins the decode batch (after every prompt) the engine copies its K/V from the paged pool into a
decode mirror row (runtime.kv.mirror.DecodeMirror). Here two mirrors of SmolLM2's shape (its config; the K/V are
random float32 values in a pool of 16-token pages handed out in shuffled order) fill the same row in turn: one
with the native library (`runtime/native/mirror_fill.c`, every layer in one call), one without it (a gather and a
transposed copy per layer for K and for V, PyTorch's). `--threads` is torch's thread count, as the engine's step
sets it; `--busy` levels start that many `python -c 'while True: pass'` processes half a second before the level's
rounds and kill them by pid after. One untimed fill per length first (the rows' reallocation), then each round
fills a fresh row in both mirrors, in alternating order; the table gives the median and the slowest fill of each,
and the ratio of the medians (PyTorch's over the native call's).

With `--engine` the fills are timed where they happen: a real Engine (SmolLM2, `--quant`, `--threads` fixed, cache
off) generates 2 tokens after a fresh prompt of each length, and the time its first decode step spends in
`DecodeMirror._load` counts; for the PyTorch fill the native call is declined for that generate. There the OpenMP
team comes to the fill from a prefill and a native decode team's step, not from the previous fill.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from scripts.bench_busy import start_busy, stop_busy
from scripts.script_args import at_least

PAGE = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--positions", type=lambda t: [at_least(1)(v) for v in t.split(",")], default=[512, 4000])
    p.add_argument("--busy", type=lambda t: [at_least(0)(v) for v in t.split(",")], default=[0, 2])
    p.add_argument("--rounds", type=at_least(1), default=7)
    p.add_argument("--threads", type=at_least(1), default=2)
    p.add_argument("--engine", action="store_true", help="time the fills inside a real Engine's decode steps")
    p.add_argument("--quant", choices=["gguf", "none"], default="gguf", help="the Engine's weights (--engine)")
    return p.parse_args(argv)


def alone(args: argparse.Namespace) -> Callable[[str, int, int], float]:
    """Two mirrors filling rows from one pool of random K/V: fill(name, n, round) -> seconds."""
    import torch

    from radixcache.runtime.kv.mirror import DecodeMirror
    from radixcache.runtime.kv.pool import KVPool
    from radixcache.runtime.loading import load_config_and_tokenizer
    from radixcache.runtime.native.ops import NativeDecodeOps

    config, _ = load_config_and_tokenizer()
    torch.set_num_threads(args.threads)
    blocks = -(-(max(args.positions) + 1) // PAGE) + 1  # the pages of n + 1 positions (the new token's too), one spare
    pool = KVPool(config, blocks, PAGE)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(0)))
    mirrors = {
        "native": DecodeMirror(config, torch.float32, "cpu", 1 << 32, native=NativeDecodeOps()),
        "torch": DecodeMirror(config, torch.float32, "cpu", 1 << 32, native=None),
    }
    lengths: dict[str, int] = {}

    def fill(name: str, n: int, r: int) -> float:
        if lengths.get(name) != n:  # untimed: the rows' reallocation to this length
            mirrors[name].prepare([("warm-up", n)], [list(range(-(-(n + 1) // PAGE)))], [n + 1], pool)
            lengths[name] = n
        table = random.Random(r).sample(range(blocks), -(-(n + 1) // PAGE))
        start = time.perf_counter()
        mirrors[name].prepare([("seq", n, r, time.perf_counter())], [table], [n + 1], pool)  # a new key: a fill
        return time.perf_counter() - start

    print(
        f"# alone: {config.num_layers} layers, {config.num_kv_heads} KV heads of {config.head_dim};"
        f" {args.threads} threads"
    )
    return fill


def in_engine(args: argparse.Namespace) -> Callable[[str, int, int], float]:
    """A real Engine (SmolLM2, `--quant`, `--threads` fixed, cache off): fill(name, n, round) generates 2 tokens
    after a fresh n-token prompt and returns the time its decode step spent in DecodeMirror._load; "torch" declines
    the native call for that generate, so the mirror's own PyTorch copy runs."""
    from radixcache.runtime import Engine
    from radixcache.runtime.loading import load_model
    from radixcache.runtime.model.llama import LlamaModel

    gguf = args.quant == "gguf"
    loaded = load_model("smollm2", keep_blocks=gguf)
    model = LlamaModel(loaded.config, loaded.weights, quant=args.quant, blocks=loaded.blocks if gguf else None)
    engine = Engine(
        model, tokenizer=loaded.tokenizer, threads=args.threads, thread_policy="fixed", kv_memory="512MiB",
        enable_cache=False,
    )  # fmt: skip
    mirror = engine.runner.mirror
    ops, load = mirror.native, mirror._load
    spent: list[float] = []

    def timed_load(*a: object) -> None:
        start = time.perf_counter()
        load(*a)
        spent.append(time.perf_counter() - start)

    mirror._load = timed_load

    def fill(name: str, n: int, r: int) -> float:
        if name == "torch":
            ops.fill_mirror = lambda *a, **k: False  # the instance's attribute: declined, the caller copies
        spent.clear()
        try:
            engine.generate([100 + (7 * i + 13 * r) % 40000 for i in range(n)], 2, ignore_eos=True)
        finally:
            vars(ops).pop("fill_mirror", None)
        return sum(spent)

    print(f"# in an Engine: SmolLM2 {args.quant}, {args.threads} fixed threads")
    return fill


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    fill = in_engine(args) if args.engine else alone(args)
    print("| positions | busy | native ms (median, slowest) | torch ms (median, slowest) | torch / native |")
    print("|---:|---:|---:|---:|---:|")
    for busy in args.busy:
        procs = start_busy(busy)
        try:
            for n in args.positions:
                times: dict[str, list[float]] = {"native": [], "torch": []}
                for r in range(args.rounds):
                    for name in sorted(times, reverse=bool(r % 2)):
                        times[name].append(fill(name, n, r))
                med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
                worst = {name: max(v) * 1e3 for name, v in times.items()}
                print(
                    f"| {n} | {busy} | {med['native']:.1f}, {worst['native']:.1f} | {med['torch']:.1f}, "
                    f"{worst['torch']:.1f} | {med['torch'] / med['native']:.2f}x |"
                )
        finally:
            stop_busy(procs)


if __name__ == "__main__":
    main()
