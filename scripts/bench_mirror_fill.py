"""A decode mirror row's fill from the pool after a prompt: one native call against PyTorch's copy per layer, on an
idle machine and beside busy programs.

    .venv/bin/python scripts/bench_mirror_fill.py                          # 512 and 4,000 positions, 0 and 2 busy
    .venv/bin/python scripts/bench_mirror_fill.py --positions 2000 --busy 1 --rounds 5 --threads 1

When a sequence joins the decode batch (after every prompt) the engine copies its K/V from the paged pool into a
decode mirror row (runtime.kv.mirror.DecodeMirror). Here two mirrors of SmolLM2's shape (its config; the K/V are
random float32 values in a pool of 16-token pages handed out in shuffled order) fill the same row in turn: one
with the native library (`runtime/native/mirror_fill.c`, every layer in one call), one without it (a gather and a
transposed copy per layer for K and for V, PyTorch's). `--threads` is torch's thread count, as the engine's step
sets it; `--busy` levels start that many `python -c 'while True: pass'` processes half a second before the level's
rounds and kill them by pid after. One untimed fill per length first (the rows' reallocation), then each round
fills a fresh row in both mirrors, in alternating order; the table gives the median and the slowest fill of each,
and the ratio of the medians (PyTorch's over the native call's).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from scripts.script_args import at_least

PAGE = 16
BUSY_LOOP = "while True: pass"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--positions", type=lambda t: [at_least(1)(v) for v in t.split(",")], default=[512, 4000])
    p.add_argument("--busy", type=lambda t: [at_least(0)(v) for v in t.split(",")], default=[0, 2])
    p.add_argument("--rounds", type=at_least(1), default=7)
    p.add_argument("--threads", type=at_least(1), default=2)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from radixcache.runtime.kv.mirror import DecodeMirror
    from radixcache.runtime.kv.pool import KVPool
    from radixcache.runtime.loading import load_config_and_tokenizer
    from radixcache.runtime.native.ops import NativeDecodeOps

    config, _ = load_config_and_tokenizer()
    torch.set_num_threads(args.threads)
    longest = max(args.positions)
    blocks = -(-longest // PAGE) + 1
    pool = KVPool(config, blocks, PAGE)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(0)))
    mirrors = {
        "native": DecodeMirror(config, torch.float32, "cpu", 1 << 32, native=NativeDecodeOps()),
        "torch": DecodeMirror(config, torch.float32, "cpu", 1 << 32, native=None),
    }
    print(f"# {config.num_layers} layers, {config.num_kv_heads} KV heads of {config.head_dim}; {args.threads} threads")
    print("| positions | busy | native ms (median, slowest) | torch ms (median, slowest) | torch / native |")
    print("|---:|---:|---:|---:|---:|")
    for busy in args.busy:
        procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(busy)]
        try:
            time.sleep(0.5 if busy else 0)
            for n in args.positions:
                times: dict[str, list[float]] = {name: [] for name in mirrors}
                for mirror in mirrors.values():  # untimed: the rows' reallocation to this length
                    mirror.prepare([("warm-up", busy, n)], [list(range(-(-n // PAGE)))], [n + 1], pool)
                for r in range(args.rounds):
                    table = random.Random(r).sample(range(blocks), -(-n // PAGE))
                    for name in sorted(mirrors, reverse=bool(r % 2)):
                        start = time.perf_counter()
                        mirrors[name].prepare([("seq", busy, n, r)], [table], [n + 1], pool)  # a new key: a fill
                        times[name].append(time.perf_counter() - start)
                med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
                worst = {name: max(v) * 1e3 for name, v in times.items()}
                print(
                    f"| {n} | {busy} | {med['native']:.1f}, {worst['native']:.1f} | {med['torch']:.1f}, "
                    f"{worst['torch']:.1f} | {med['torch'] / med['native']:.2f}x |"
                )
        finally:
            for p in procs:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
