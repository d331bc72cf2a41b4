"""Benchmark the native paged attention (runtime/native/decode_attention.c `native_paged_attention`) on SmolLM2's
shapes, against what it replaced, in one interleaved run:

- kernel: one query over `--lengths` cached positions, all 30 layers' K/V read cold from pool pages (each layer's
  pages are its own memory), through the native paged kernel, PyTorch's flash kernel over the pages' runs (the path
  before it), and the decode mirror's native kernel over contiguous head-major rows (its reference speed);
- pass: `LlamaModel.forward` of a decode (a 48-token context) alone, and beside the one token a prompt found whole
  in the cache computes again (a chunk at position P - 1 over P cached positions), with the paged kernel and with
  the flash path (`chunk_rows.PAGED_ROWS` set to 0 for that pass).

    .venv/bin/python scripts/bench_paged_attention.py                 # a minute on 2 cores
    .venv/bin/python scripts/bench_paged_attention.py --lengths 500 2000 4000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from radixcache.runtime import Engine  # noqa: E402
from radixcache.runtime.loading import load_model  # noqa: E402
from radixcache.runtime.model import chunk_rows  # noqa: E402
from radixcache.runtime.model.attention import (  # noqa: E402
    _attend_runs,
    build_decode_meta,
    page_runs,
)
from radixcache.runtime.model.batch import DecodeBatch, PrefillChunk  # noqa: E402
from radixcache.runtime.native.ops import NativeDecodeOps  # noqa: E402

PAGE, LAYERS, KV_HEADS, HEADS, HEAD_DIM = 16, 30, 3, 9, 64


def median_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def kernels(length: int, reps: int) -> dict[str, float]:
    """ms for one query over `length` positions, 30 layers."""
    ops = NativeDecodeOps()
    blocks = -(-length // PAGE)
    g = torch.Generator().manual_seed(length)
    pools = [torch.randn(2, blocks, PAGE, KV_HEADS, HEAD_DIM, generator=g) for _ in range(LAYERS)]
    rows = [torch.randn(2, 1, KV_HEADS, length, HEAD_DIM, generator=g) for _ in range(LAYERS)]
    table = torch.arange(blocks)
    q = torch.randn(1, HEADS, HEAD_DIM, generator=g)
    runs = page_runs(table.tolist(), length, PAGE)
    assert runs is not None

    def paged() -> None:
        for kv in pools:
            ops.attend_pages(q, kv[0], kv[1], table, length - 1)

    def flash_runs() -> None:
        for kv in pools:
            _attend_runs(q.view(1, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM), kv[0], kv[1], runs)

    def mirror() -> None:
        for kv in rows:
            ops.attend(q, kv[0], kv[1], [length])

    out = {"paged": [], "flash runs": [], "mirror": []}
    for _ in range(3):  # interleaved
        out["paged"].append(median_ms(paged, reps))
        out["flash runs"].append(median_ms(flash_runs, reps))
        out["mirror"].append(median_ms(mirror, reps))
    return {k: statistics.median(v) for k, v in out.items()}


def passes(engine: Engine, length: int, reps: int) -> dict[str, float]:
    """ms of a forward pass: a decode alone, and beside a one-token chunk over `length` cached positions."""
    model, pool = engine.model, engine.pool
    g = torch.Generator().manual_seed(length + 1)
    vocab = model.config.vocab_size
    long = torch.randint(10, vocab, (length,), generator=g).tolist()
    short = torch.randint(10, vocab, (49,), generator=g).tolist()
    long_table = list(range(-(-length // PAGE)))
    short_table = list(range(len(long_table), len(long_table) + 4))
    model.forward(pool, chunks=[PrefillChunk(long, 0, long_table)])
    model.forward(pool, chunks=[PrefillChunk(short[:48], 0, short_table)])

    def decode() -> DecodeBatch:
        return DecodeBatch([short[48]], build_decode_meta([short_table], [49], PAGE, model.device))

    def alone() -> None:
        model.forward(pool, decode=decode())

    def beside() -> None:
        model.forward(pool, decode=decode(), chunks=[PrefillChunk(long[-1:], length - 1, long_table)])

    def beside_flash() -> None:
        kept = chunk_rows.PAGED_ROWS
        chunk_rows.PAGED_ROWS = 0
        try:
            beside()
        finally:
            chunk_rows.PAGED_ROWS = kept

    out = {"decode alone": [], "+ 1 token, paged": [], "+ 1 token, flash": []}
    for _ in range(3):
        out["decode alone"].append(median_ms(alone, reps))
        out["+ 1 token, paged"].append(median_ms(beside, reps))
        out["+ 1 token, flash"].append(median_ms(beside_flash, reps))
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lengths", type=int, nargs="+", default=[500, 2000, 4000])
    parser.add_argument("--reps", type=int, default=9, help="timed calls per measurement (median)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"{args.threads} threads, SmolLM2's shapes ({LAYERS} layers, {HEADS} query / {KV_HEADS} KV heads of {HEAD_DIM})"
    )
    print("\n| positions | native paged ms | flash over runs ms | mirror kernel ms | flash / paged | paged / mirror |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in args.lengths:
        k = kernels(n, args.reps)
        print(
            f"| {n} | {k['paged']:.2f} | {k['flash runs']:.2f} | {k['mirror']:.2f} "
            f"| {k['flash runs'] / k['paged']:.2f}x | {k['paged'] / k['mirror']:.2f}x |"
        )
    most = max(args.lengths)
    blocks = sum(-(-n // PAGE) for n in [most]) + 8
    with Engine(load_model(args.model), capacity_blocks=blocks, page_size=PAGE, threads=args.threads) as engine:
        print(
            "\n| cached positions | decode alone ms | + 1 token, paged ms | + 1 token, flash ms | paged - alone ms "
            "| flash - alone ms |"
        )
        print("|---:|---:|---:|---:|---:|---:|")
        for n in args.lengths:
            p = passes(engine, n, args.reps)
            a = p["decode alone"]
            print(
                f"| {n} | {a:.1f} | {p['+ 1 token, paged']:.1f} | {p['+ 1 token, flash']:.1f} "
                f"| {p['+ 1 token, paged'] - a:.1f} | {p['+ 1 token, flash'] - a:.1f} |"
            )


if __name__ == "__main__":
    main()
