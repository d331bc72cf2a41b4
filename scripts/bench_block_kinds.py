"""One product of each GGUF block kind through the native kernels, float32, 16-bit and int8 activations, against
the machine's read bandwidth: which kinds stream at memory speed and which are bound by arithmetic.

    .venv/bin/python scripts/bench_block_kinds.py                      # 4096 x 4096, 1 and 8 tokens, 2 threads
    .venv/bin/python scripts/bench_block_kinds.py --kinds Q4_K,Q6_K --tokens 1 --threads 1,2 --rounds 5
    .venv/bin/python scripts/bench_block_kinds.py --json kinds.json

A `--rows` x `--cols` weight of standard-normal values (scaled 0.05) is encoded in each kind (the tests' encoders:
the `gguf` package's for the 32-value kinds, tests/runtime/loading/kquants.py for the K-quants; a checkout is
needed), and a `--tokens` x `--cols` activation is multiplied by it with `blockdot_matmul` (float32 activations:
quant="gguf"'s prefill rows), `qdot16_matmul` (16-bit: its decode rows by default) and `qdot_matmul` (int8, opt-in) of
the library runtime.native builds from this tree (`--kernels float,int16,int8`, the default). Each round reads the
bandwidth first (runtime.machine.read_bandwidth_gbs, a `--bandwidth-mb` (512) MB sum at the same thread count; a
smaller one reads faster and, once it fits the caches, reads the caches, not the memory), then times every
(threads, kind, kernel, tokens) in turn: one untimed call, then the fastest of `--calls` calls. A weight of 9 MB stays
in the last-level cache between calls, so a kind that reads well below the bandwidth here is bound by its arithmetic,
not by memory. Medians over rounds are printed, with the weight's bytes over the time (GB/s) and that over the round's
bandwidth.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' encoders, from a checkout

# First: runtime sets libgomp's spin defaults, which only take effect if torch is not loaded yet.
import radixcache.runtime  # noqa: E402, F401

# isort: split
import numpy as np  # noqa: E402

from radixcache.runtime.model.block_names import KINDS  # noqa: E402

# torch and the kernels are imported in main(), after the arguments are checked: a bad one is refused at once.

KERNELS = {"float": "blockdot_matmul", "int16": "qdot16_matmul", "int8": "qdot_matmul"}


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"want positive integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096, help="a multiple of 256 (the K-quants' super-blocks)")
    p.add_argument("--tokens", type=int_list, default=[1, 8], help="activation rows per call, 1 to 8")
    p.add_argument("--threads", type=int_list, default=[2])
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--kernels", default="float,int16,int8")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=15, help="timed calls per measurement (the fastest counts)")
    p.add_argument("--bandwidth-mb", type=int, default=512, help="MB summed for each bandwidth reading")
    p.add_argument("--json", help="write every round's figures here")
    args = p.parse_args(argv)
    args.kinds = args.kinds.split(",")
    args.kernels = args.kernels.split(",")
    bad = [k for k in args.kinds if k not in KINDS] + [k for k in args.kernels if k not in KERNELS]
    if bad:
        p.error(f"unknown kind or kernel {bad}: kinds are {', '.join(KINDS)}; kernels {', '.join(KERNELS)}")
    if args.rows < 1 or args.cols < 256 or args.cols % 256:
        p.error(f"--rows must be positive and --cols a multiple of 256, got {args.rows} x {args.cols}")
    if max(args.tokens) > 8 or args.rounds < 1 or args.calls < 1 or args.bandwidth_mb < 1:
        p.error("--tokens at most 8; --rounds, --calls and --bandwidth-mb at least 1")
    return args


def encode(kind: str, rows: int, cols: int) -> np.ndarray:
    """The weight's bytes in `kind`: uint8 [rows, cols / block elements * block bytes]."""
    from radixcache.runtime.model.block_linear import BLOCK_ELEMS
    from tests.runtime.loading.kquants import quantize

    w = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32) * np.float32(0.05)
    assert cols % BLOCK_ELEMS[kind] == 0
    return np.ascontiguousarray(quantize(w, kind))


def fastest_call(fn: Any, calls: int) -> float:
    fn()
    best = float("inf")
    for _ in range(calls):
        t = time.perf_counter()
        status = fn()
        best = min(best, time.perf_counter() - t)
        if status != 0:
            raise RuntimeError(f"the kernel refused the call (status {status})")
    return best


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from radixcache.runtime.machine import cpu_fields, read_bandwidth_gbs
    from radixcache.runtime.model.dequant import GGML_TYPE_IDS
    from radixcache.runtime.native import blockdot

    lib = blockdot()
    weights = {k: encode(k, args.rows, args.cols) for k in args.kinds}
    x = np.random.default_rng(1).standard_normal((max(args.tokens), args.cols), dtype=np.float32)
    y = np.zeros((max(args.tokens), args.rows), np.float32)
    rows_arg = (ctypes.c_int * 1)(args.rows)

    def call(kind: str, kernel: str, tokens: int) -> Any:
        data = (ctypes.c_void_p * 1)(weights[kind].ctypes.data)
        kinds = (ctypes.c_int * 1)(GGML_TYPE_IDS[kind])
        fn = getattr(lib, KERNELS[kernel])
        return lambda: fn(1, data, kinds, rows_arg, args.cols, x.ctypes.data, tokens, y.ctypes.data, args.rows)

    cpu = cpu_fields().get("model name", "?")
    paths = f"float vector width {lib.blockdot_vector_width()}, int8 path {lib.qdot_path()} (3 AVX-512 VNNI)"
    print(f"# {cpu}, {os.cpu_count()} CPUs, {args.rows} x {args.cols}, {paths}", flush=True)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        row: dict[str, Any] = {"bandwidth": {}, "ms": {}}
        for threads in args.threads:
            torch.set_num_threads(threads)
            row["bandwidth"][threads] = read_bandwidth_gbs(args.bandwidth_mb, threads=threads)
            for kind in args.kinds:
                for kernel in args.kernels:
                    for tokens in args.tokens:
                        key = f"{threads}/{kind}/{kernel}/{tokens}"
                        row["ms"][key] = 1e3 * fastest_call(call(kind, kernel, tokens), args.calls)
        bws = ", ".join(f"{t} threads {bw:.1f} GB/s" for t, bw in row["bandwidth"].items())
        print(f"  round {r + 1}/{args.rounds}: bandwidth {bws}", flush=True)
        rounds.append(row)
    heads = " | ".join(f"{k} ms | {k} GB/s" for k in args.kernels)
    print(f"\n| threads | kind | bits / weight | tokens | {heads} |")
    print("|---|---|---:|---:|" + "---:|---:|" * len(args.kernels))
    summary = []
    for threads in args.threads:
        bw = statistics.median(rd["bandwidth"][threads] for rd in rounds)
        for kind in args.kinds:
            nbytes = weights[kind].nbytes
            for tokens in args.tokens:
                cells, entry = [], {"threads": threads, "kind": kind, "tokens": tokens, "bandwidth": bw}
                for kernel in args.kernels:
                    ms = statistics.median(rd["ms"][f"{threads}/{kind}/{kernel}/{tokens}"] for rd in rounds)
                    gbs = nbytes / ms / 1e6
                    cells.append(f"{ms:.3f} | {gbs:.1f} ({gbs / bw:.0%})")
                    entry[kernel] = {"ms": ms, "gbs": gbs}
                bpw = 8 * nbytes / (args.rows * args.cols)
                print(f"| {threads} | {kind} | {bpw:.2f} | {tokens} | " + " | ".join(cells) + " |")
                summary.append(entry)
    print("\nGB/s: the weight's bytes over the median time; (%): of the median read bandwidth at that thread count.")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rounds, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
