"""Where a decode step's time goes: torch.profiler (CPU) over decode steps of the raw model, split by part.

    .venv/bin/python scripts/profile_decode.py                       # fp32, batch 1 and 8, 20 steps each
    .venv/bin/python scripts/profile_decode.py --quant fp16 --steps 50
    .venv/bin/python scripts/profile_decode.py --batch 1 --threads 2 --top 25
    .venv/bin/python scripts/profile_decode.py --no-mirror               # attention over the pages instead

Each batch size gets its own pool holding a 512-token prefill per sequence; the profiled steps then decode at
context 513 (`--context`), on this thread (no engine), reading the decode mirror as the Engine does
(radixcache.runtime.kv.mirror; `--no-mirror`: the pages, by the gather or in-place paths). The parts are labelled with
`torch.profiler.record_function` by wrapping the model's pieces from here, without touching runtime/:
- the model's `_norm` (RMSNorm), `model.llama`'s `decode_attention`, `model.llama_layers`' `_rope_signed` and its `F`
  (a proxy whose `embedding` and `silu` are labelled; `F.silu(gate) * up` is timed as one part, the product included);
- `runtime.model.attention`'s `F.scaled_dot_product_attention` (so attention splits into SDPA and the rest: the page
  gather at batch > 1; at batch 1 the in-place path calls the SDPA kernel op directly, so all of its attention,
  the per-run kernels and the log-sum-exp merge, shows under "attention: in place / gather");
- every layer's linear objects (qkv, o, gate_up, down) and the LM head; the pool's `write` (KV write);
- the mirror step's `write` and `attend` (`radixcache.runtime.kv.mirror.MirrorStep`); where the model fuses a
  decode pass (runtime.model.fused_decode: float32 on the CPU with the native library), RoPE and both K/V writes
  are one native call, labelled "rope + kv writes (fused)", and the three separate labels stay empty.
"other" is the step's time outside every label: residual adds, RoPE table lookup, slicing, the float() of the
logits. Each label costs a few microseconds, so the profiled step is somewhat slower than the plain one (both
are printed); the per-part split is what this is for.

Run it on an idle machine: with OMP_WAIT_POLICY=ACTIVE (runtime's default) a busy CPU makes every parallel op
wait for a descheduled thread, and the profile then mostly shows that wait (a warning says so).

Prints, per batch size: ms/step and % per part, the top ATen ops by self time; then one markdown table.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# First: runtime sets libgomp's spin defaults, which only take effect if torch is not loaded yet.
import radixcache.runtime  # noqa: F401

# isort: split

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

import radixcache.runtime.model.attention as rattn
import radixcache.runtime.model.llama as rmodel
import radixcache.runtime.model.llama_layers as rlayers
from radixcache.runtime.kv.mirror import DecodeMirror, MirrorStep
from radixcache.runtime.loading import load_model
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.native.ops import NativeDecodeOps

PAGE = 16
STEP = "decode step"
FUSED = "rope + kv writes (fused)"  # model.fused_decode's native call: a decode pass over the mirror
GATHER = "attention: in place / gather"  # derived: the attention label less F.scaled_dot_product_attention
SDPA = "attention: sdpa"
# Report order. Every label but SDPA is top level (none nests in another), so their sum is the labelled time.
PARTS = [
    "embedding",
    "rmsnorm",
    "qkv proj",
    "rope",
    "kv write",
    "kv write (mirror)",
    FUSED,
    "attention: mirror",
    GATHER,
    SDPA,
    "o proj",
    "mlp: gate_up",
    "mlp: silu*up",
    "mlp: down",
    "lm head",
]
ATTENTION = "attention"  # the whole of decode_attention, measured; GATHER = ATTENTION - SDPA
LABELS = {STEP, ATTENTION, *PARTS} - {GATHER}


def labelled(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return fn(*args, **kwargs)

    return wrapped


class LabelledLinear:
    """A radixcache.runtime.model.linear layer whose calls are one labelled part."""

    def __init__(self, inner: Any, name: str) -> None:
        self.inner = inner
        self.name = name
        self.out_features = inner.out_features

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def __call__(self, x: torch.Tensor, prefill: bool = False, *, decode_rows: int | None = None) -> torch.Tensor:
        with record_function(self.name):
            return self.inner(x, prefill, decode_rows=decode_rows)


class SiluTimesUp:
    """What the proxy's `F.silu(gate)` returns: `* up` then computes silu(gate) * up under one label."""

    def __init__(self, gate: torch.Tensor) -> None:
        self.gate = gate

    def __mul__(self, other: torch.Tensor) -> torch.Tensor:
        with record_function("mlp: silu*up"):
            return F.silu(self.gate) * other

    __rmul__ = __mul__


class FunctionalProxy:
    """Stands in for `torch.nn.functional` inside one runtime module: a few functions replaced, the rest as is."""

    def __init__(self, **overrides: Callable[..., Any]) -> None:
        self._overrides = overrides

    def __getattr__(self, name: str) -> Any:
        return self._overrides.get(name) or getattr(F, name)


def instrument(model: LlamaModel) -> None:
    """Label the model's parts (module globals of model.llama, model.llama_layers and model.attention, and the
    model's layers)."""
    rlayers.F = FunctionalProxy(embedding=labelled("embedding", F.embedding), silu=SiluTimesUp)  # type: ignore[assignment]
    model._norm = labelled("rmsnorm", model._norm)  # type: ignore[method-assign]
    rlayers._rope_signed = labelled("rope", rlayers._rope_signed)
    rmodel.decode_attention = labelled(ATTENTION, rmodel.decode_attention)
    MirrorStep.write = labelled("kv write (mirror)", MirrorStep.write)  # type: ignore[method-assign]
    MirrorStep.attend = labelled("attention: mirror", MirrorStep.attend)  # type: ignore[method-assign]
    NativeDecodeOps.rope_store = labelled(FUSED, NativeDecodeOps.rope_store)  # type: ignore[method-assign]
    rattn.F = FunctionalProxy(scaled_dot_product_attention=labelled(SDPA, F.scaled_dot_product_attention))  # type: ignore[assignment]
    model.layers = [
        dataclasses.replace(
            layer,
            qkv=LabelledLinear(layer.qkv, "qkv proj"),
            o=LabelledLinear(layer.o, "o proj"),
            gate_up=LabelledLinear(layer.gate_up, "mlp: gate_up"),
            down=LabelledLinear(layer.down, "mlp: down"),
        )
        for layer in model.layers
    ]
    model.lm_head = LabelledLinear(model.lm_head, "lm head")


def prompt_ids(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(1000, min(vocab, 30000), (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def setup(model: LlamaModel, batch: int, ctx: int, mirror: bool) -> Callable[[], torch.Tensor]:
    """A pool with `batch` sequences of `ctx - 1` tokens prefilled; returns one decode step at context `ctx`
    (through a decode mirror filled once, with `mirror`)."""
    n_pages = -(-ctx // PAGE)
    pool = model.new_pool(batch * n_pages, PAGE)
    tables = [list(range(b * n_pages, (b + 1) * n_pages)) for b in range(batch)]
    vocab = model.config.vocab_size
    with torch.inference_mode():
        for b in range(batch):
            model.prefill(prompt_ids(ctx - 1, vocab, 100 + b), 0, tables[b], pool)
    meta = build_decode_meta(tables, [ctx] * batch, PAGE, model.device)
    toks = prompt_ids(batch, vocab, 9)
    rows = None
    if mirror:
        rows = DecodeMirror(model.config, model.dtype, model.device, 1 << 40, native=model.native).prepare(
            list(range(batch)), tables, [ctx] * batch, pool
        )
    pool.write = labelled("kv write", pool.write)  # type: ignore[method-assign]

    def step() -> torch.Tensor:
        with torch.inference_mode(), record_function(STEP):
            return model.decode(toks, meta, pool, rows)  # rewrites the same slot each time

    return step


def plain_ms(step: Callable[[], torch.Tensor], n: int) -> tuple[float, float]:
    """Fastest and median step without the profiler (the labels stay: record_function is near free unprofiled)."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        step()
        times.append((time.perf_counter() - t) * 1000)
    return min(times), statistics.median(times)


def profile_steps(step: Callable[[], torch.Tensor], n: int, top: int) -> dict[str, Any]:
    for _ in range(3):  # warm-up: first calls allocate and pick kernels
        step()
    plain, plain_median = plain_ms(step, n)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            step()
    events = prof.key_averages()
    total = {e.key: e.cpu_time_total / 1000 / n for e in events}  # inclusive ms per step
    step_ms = total.get(STEP, 0.0)
    parts = {p: total.get(p, 0.0) for p in PARTS if p != GATHER}
    parts[GATHER] = total.get(ATTENTION, 0.0) - parts[SDPA]
    parts = {p: parts[p] for p in PARTS}
    parts["other"] = step_ms - sum(parts.values())
    ops = sorted(
        (e for e in events if e.key not in LABELS),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )[:top]
    op_rows = [(e.key, e.count / n, e.self_cpu_time_total / 1000 / n) for e in ops]
    return {"plain_ms": plain, "plain_median_ms": plain_median, "step_ms": step_ms, "parts": parts, "ops": op_rows}


def print_result(batch: int, res: dict[str, Any]) -> None:
    step_ms = res["step_ms"]
    print(
        f"\n## batch {batch}: {step_ms:.2f} ms/step profiled, {res['plain_ms']:.2f} ms/step plain "
        f"(median {res['plain_median_ms']:.2f}; {batch * 1000 / res['plain_ms']:.1f} tok/s)"
    )
    if step_ms > 1.5 * res["plain_median_ms"]:
        # With OMP_WAIT_POLICY=ACTIVE every OpenMP barrier needs all threads on a core: when other processes
        # hold the cores, each parallel op can wait a scheduler slice and the split below is mostly that wait.
        print("  WARNING: profiled steps ran > 1.5x slower than plain ones: the machine is busy; rerun when idle")
    for part, ms in res["parts"].items():
        print(f"  {part:<24} {ms:8.3f} ms  {100 * ms / step_ms:5.1f} %")
    print(f"\n  top ATen ops by self time (per step), batch {batch}:")
    print(f"  {'op':<44} {'calls':>7} {'self ms':>9} {'%':>6}")
    for name, calls, ms in res["ops"]:
        print(f"  {name[:44]:<44} {calls:7.0f} {ms:9.3f} {100 * ms / step_ms:6.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quant", default="none", choices=["none", "fp16", "gguf"])
    ap.add_argument("--no-mirror", action="store_true", help="attend over the pages, not the decode mirror")
    ap.add_argument("--batch", default="1,8", help="comma list of batch sizes")
    ap.add_argument("--context", type=int, default=513, help="tokens per sequence, the decoded one included")
    ap.add_argument("--steps", type=int, default=20, help="profiled decode steps per batch size")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--top", type=int, default=15, help="ATen ops to list")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batch.split(",") if b.strip()]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"# {os.cpu_count()} CPUs, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"load average {load:.2f}; quant={args.quant}, context {args.context}, {args.steps} steps"
    )
    smol = load_model(args.model, keep_blocks=args.quant == "gguf")
    model = LlamaModel(smol.config, smol.weights, quant=args.quant, blocks=smol.blocks)
    instrument(model)
    results = {}
    for batch in batches:
        step = setup(model, batch, args.context, mirror=not args.no_mirror)
        results[batch] = profile_steps(step, args.steps, args.top)
        print_result(batch, results[batch])

    tag = "fp32" if args.quant == "none" else args.quant
    kv = "pages" if args.no_mirror else "decode mirror"
    print(f"\n### decode step by part, {tag}, {kv}, context {args.context}\n")
    print("| part | " + " | ".join(f"batch {b} ms | batch {b} %" for b in batches) + " |")
    print("| --- |" + " --- | --- |" * len(batches))
    for part in [*PARTS, "other"]:
        cells = []
        for b in batches:
            ms, step_ms = results[b]["parts"][part], results[b]["step_ms"]
            cells += [f"{ms:.3f}", f"{100 * ms / step_ms:.1f}"]
        print(f"| {part} | " + " | ".join(cells) + " |")
    cells = []
    for b in batches:
        cells += [f"{results[b]['step_ms']:.3f}", "100.0"]
    print("| **step (profiled)** | " + " | ".join(cells) + " |")
    print("| step (plain, unprofiled) | " + " | ".join(f"{results[b]['plain_ms']:.3f} | " for b in batches) + " |")


if __name__ == "__main__":
    main()
