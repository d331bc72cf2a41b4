"""`radixcache doctor`'s measurements: this machine (CPU, the flags that matter, load, memory read bandwidth), torch,
the kernels the engine chose for each weight shape (runtime.model.kernel_tune), and a short batch-1 decode of a
model against its bandwidth bound.

The bound: batch-1 decode reads every weight once per token, so it cannot beat (read bandwidth) / (bytes of
weights read per token), whatever the kernels. The bandwidth is read before and after the decode and the bound
uses their mean; `bandwidth_read["steady"]` says whether the two agree within machine.STEADY_TOLERANCE.
`decode_tps / bound_tps` says how much of the machine the engine uses; the kernels' own speed per shape is in the
plan's timings. With quant="gguf" the report also names the block kinds the decode multiplies and the activations
their kernels take (float unless asked otherwise): the 4-6 bit kinds are bound by arithmetic at one token, so a
GGUF decode sits well under this bound (scripts/bench_block_kinds.py measures each kind).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from radixcache.runtime.cores import default_threads, usable_cores
from radixcache.runtime.machine import (
    KERNEL_FLAGS,
    bandwidth_steady,
    cpu_model,
    kernel_flags,
    load_average,
    load_averages,
    read_bandwidth_gbs,
)
from radixcache.runtime.model.kernel_plan import BUCKETS, KernelPlan
from radixcache.runtime.model.quant import check_gguf_activations

SHOWN_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx")  # amx: amx_tile (and amx_int8)


@dataclass
class DoctorReport:
    """What `diagnose` measured; `to_json()` is the CLI's --json."""

    cpu: str
    cores: int
    flags: dict[str, bool]
    torch: str
    threads: int
    load_average: dict[str, float | None]
    bandwidth_gbs: float  # the mean of the readings before and after the decode: the bound's
    model: str
    quant: str
    weight_bytes_per_token: int
    kernels: dict[str, Any]
    decode: dict[str, Any] = field(default_factory=dict)
    blocks: dict[str, Any] | None = None  # quant="gguf": the block kinds and the kernels' activations (describe_blocks)
    bandwidth_read: dict[str, Any] = field(default_factory=dict)  # before, after (GB/s), steady (bandwidth_steady)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def cpu_flags() -> dict[str, bool]:
    """Each of SHOWN_FLAGS: whether this CPU advertises it ("amx" for amx_tile)."""
    have = set(kernel_flags())
    return {flag: ("amx_tile" if flag == "amx" else flag) in have for flag in SHOWN_FLAGS}


def weight_bytes_per_token(model: Any) -> int:
    """Bytes of weights a batch-1 decode step reads: every layer's products and the output head (its `nbytes`:
    the blocks for quant="gguf", two bytes a weight for fp16). Norms and the embedding row are negligible."""
    total = model.lm_head.nbytes
    for layer in model.layers:
        total += layer.qkv.nbytes + layer.o.nbytes + layer.gate_up.nbytes + layer.down.nbytes
    return total


def describe_blocks(model: Any) -> dict[str, Any] | None:
    """What a quant="gguf" decode multiplies: how many block parts of each kind the layers and the output head hold
    (a fused matrix has one part per source tensor), and the activations each runs ("int16-decode", "float" ...;
    the head's apart, float always). None for a model without blocks."""
    from radixcache.runtime.model.block_linear import BlockLinear

    def kinds(linears: list[Any]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for linear in linears:
            for part in linear.parts:
                counts[part.kind] = counts.get(part.kind, 0) + 1
        return dict(sorted(counts.items()))

    names = ("qkv", "o", "gate_up", "down")
    layers = [getattr(layer, n) for layer in model.layers for n in names if isinstance(getattr(layer, n), BlockLinear)]
    head = model.lm_head if isinstance(model.lm_head, BlockLinear) else None
    if not layers and head is None:
        return None
    return {
        "layers": kinds(layers),
        "layer_activations": sorted({linear.activations for linear in layers}),
        "head": kinds([head]) if head is not None else {},
        "head_activations": head.activations if head is not None else None,
    }


def describe_plan(plan: KernelPlan, counts: dict[str, int]) -> dict[str, Any]:
    """The plan as doctor shows it: its source and file, and per shape the layers that have it, the path per row
    range ("1-2": "mm_t", ...) and, at one row, each path's read speed in GB/s (all the layers of the shape)."""
    shapes: dict[str, Any] = {}
    for shape, chosen in plan.choices.items():
        out_f, in_f = (int(v) for v in shape.split("x"))
        layers = counts.get(shape, 0)
        one_row = plan.timings_us.get(shape, {}).get(1, {})
        gbs = {p: round(layers * out_f * in_f * 4 / (us * 1e3), 1) for p, us in one_row.items() if us > 0}
        shapes[shape] = {"layers": layers, "paths": _ranges(chosen), "gbs_1_row": gbs}
    return {
        "source": plan.source,
        "note": plan.note,
        "file": plan.path,
        "measure_seconds": round(plan.seconds, 2),
        "measured_load_average": plan.load_average,
        "shapes": shapes,
    }


def _ranges(chosen: dict[int, str]) -> dict[str, str]:
    """{bucket: path} as row ranges with one path each: {"1-2": "mm_t", "3-256+": "onednn"}."""
    out: dict[str, str] = {}
    lo = prev = 1
    path = chosen[BUCKETS[0]]
    for bucket in BUCKETS[1:]:
        if chosen[bucket] != path:
            out[f"{lo}-{prev}" if lo != prev else str(lo)] = path
            lo, path = prev + 1, chosen[bucket]
        prev = bucket
    out[f"{lo}-{prev}+" if lo != prev else f"{lo}+"] = path
    return out


def diagnose(
    model: str = "smollm2",
    *,
    threads: int | None = None,
    quant: str = "none",
    kernels: str | None = None,
    prompt_tokens: int = 128,
    new_tokens: int = 32,
    bandwidth_mb: int = 256,
    gguf_activations: str | None = None,
) -> DoctorReport:
    """Measure this machine and a short decode of `model` (see the module docstring). `kernels` and
    `gguf_activations` as EngineConfig's ("retune" measures the kernels again); the decode runs `new_tokens` after a
    `prompt_tokens` prompt, batch 1, with the thread count fixed at `threads` (default: torch's, at most the cores
    this process may use: runtime.cores), after one untimed short request."""
    from radixcache.runtime.engine.engine import Engine
    from radixcache.runtime.loading import load_model
    from radixcache.runtime.model.kernel_tune import model_linears

    if prompt_tokens < 1 or new_tokens < 2:
        raise ValueError(f"prompt_tokens must be >= 1 and new_tokens >= 2, got {prompt_tokens} and {new_tokens}")
    threads = threads if threads is not None else default_threads(torch.get_num_threads())
    check_gguf_activations(gguf_activations, quant)  # before the model loads
    loaded = load_model(model, keep_blocks=quant == "gguf")
    engine = Engine(
        loaded, quant=quant, threads=threads, thread_policy="fixed", kernels=kernels, kv_memory="64MiB",
        gguf_activations=gguf_activations,
    )  # fmt: skip
    try:
        limit = engine.config.max_position  # checked before the prompt's ids are drawn (a huge one is an allocation)
        if prompt_tokens >= limit:
            raise ValueError(f"prompt of {prompt_tokens} tokens leaves no room under the model's max_position {limit}")
        if prompt_tokens + new_tokens > limit:  # the decode would stop at the limit: a rate of fewer tokens, or 0.0
            raise ValueError(
                f"prompt of {prompt_tokens} tokens and {new_tokens} new tokens pass the model's max_position {limit}"
            )
        counts: dict[str, int] = {}
        for layer in model_linears(engine.model):
            shape = f"{layer.weight.shape[0]}x{layer.weight.shape[1]}"
            counts[shape] = counts.get(shape, 0) + 1
        before = read_bandwidth_gbs(bandwidth_mb, threads=threads)
        nbytes = weight_bytes_per_token(engine.model)
        decode = _decode(engine, prompt_tokens, new_tokens)
        after = read_bandwidth_gbs(bandwidth_mb, threads=threads)
        bandwidth = (before + after) / 2
        bound = bandwidth * 1e9 / nbytes
        decode |= {"bound_tps": round(bound, 1), "of_bound": round(decode["decode_tps"] / bound, 3)}
        loads = load_averages()
        return DoctorReport(
            cpu=cpu_model(),
            cores=usable_cores(),
            flags=cpu_flags(),
            torch=torch.__version__,
            threads=threads,
            load_average={"1m": loads[0], "5m": loads[1], "15m": loads[2]},
            bandwidth_gbs=round(bandwidth, 1),
            model=engine.config.name or model,
            quant=quant,
            weight_bytes_per_token=nbytes,
            kernels={"mode": engine.engine_config.kernel_mode()} | describe_plan(engine.kernel_plan, counts),
            decode=decode,
            blocks=describe_blocks(engine.model),
            bandwidth_read={
                "before": round(before, 1),
                "after": round(after, 1),
                "steady": bandwidth_steady(before, after),
            },
        )
    finally:
        engine.close()


def _decode(engine: Any, prompt_tokens: int, new_tokens: int) -> dict[str, Any]:
    """Batch-1 decode speed: one untimed short request, then `new_tokens` (ignore_eos) after a fresh prompt."""
    vocab = engine.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(min(vocab - 1, 10), vocab, (prompt_tokens + 8,), generator=gen).tolist()
    engine.generate(ids[-8:], max_new_tokens=2, ignore_eos=True, temperature=0.0)
    load_before = load_average()
    start = time.perf_counter()
    result = engine.generate(ids[:prompt_tokens], max_new_tokens=new_tokens, ignore_eos=True, temperature=0.0)
    return {
        "prompt_tokens": prompt_tokens,
        "new_tokens": len(result.token_ids),
        "decode_tps": round(result.decode_tps, 2),
        "ttft_s": round(result.ttft_s, 3),
        "seconds": round(time.perf_counter() - start, 3),
        "load_average_1m": load_before,
    }


__all__ = ["KERNEL_FLAGS", "DoctorReport", "cpu_flags", "describe_plan", "diagnose", "weight_bytes_per_token"]
