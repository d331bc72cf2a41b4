"""bench_runtime.py's measuring kit: the interleaved rounds, the timers, the memory bandwidth and the settings.

Every comparison of scripts/bench_runtime.py runs through `run_rounds` (its docstring says why rounds). `ROUNDS`
is the run's record of every round (the JSON's "rounds"), module-level because one run of the script is one record.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

PAGE = 16


@dataclass(frozen=True)
class Settings:
    threads: int
    reps: int
    decode_tokens: int
    prompt: int  # prompt length before decode ("after a 512-token prompt")
    prefill_lens: tuple[int, ...]
    ttft_total: int
    ttft_cached: int
    ttft_rounds: int
    paged_ctx: tuple[int, ...]
    hf_batch8: bool
    long_prompt: int = 4000  # the prompt before decode in the long-context section ("after a 4,000-token prompt")


def timed(fn: Callable[[], object], reps: int) -> float:
    """Fastest of `reps` calls after one warm-up call: on a shared machine the minimum is the stable estimate of
    the cost itself (noise only ever adds time)."""
    fn()
    return min((timed_once(fn) for _ in range(reps)), default=float("inf"))


def prompt_ids(n: int, vocab: int, seed: int) -> list[int]:
    # Real text would do as well; random ids in the ordinary-word range keep the lengths exact.
    return torch.randint(1000, min(vocab, 30000), (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---------------------------------------------------------------------- rounds

ROUNDS: list[dict[str, Any]] = []  # every round of every phase, warm-ups included (the JSON's "rounds")

Measure = Callable[[], dict[str, float]]


def fmt_num(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() or abs(v) >= 100 else f"{v:,.1f}"


def run_rounds(phase: str, s: Settings, contenders: dict[str, Measure]) -> dict[str, list[dict[str, float]]]:
    """One warm-up round, then `s.reps` counted rounds. In each round every contender runs once, one after the
    other, in the order given (ours in each mode, then transformers, then llama.cpp), so that all of them see
    the same memory-bandwidth window. The memory bandwidth is measured at the start of each round. Returns each
    contender's measurements in the counted rounds."""
    counted: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    for r in range(s.reps + 1):
        bw = memory_bandwidth_gbs()
        label = "warm-up round" if r == 0 else f"round {r}/{s.reps}"
        print(f"  [{phase}, {label}] memory bandwidth {bw:.1f} GB/s", flush=True)
        values = {name: fn() for name, fn in contenders.items()}
        ROUNDS.append({"phase": phase, "round": r, "warmup": r == 0, "bandwidth_gbs": bw, "values": values})
        for name, vals in values.items():
            print(f"    {name}: " + ", ".join(f"{fmt_num(v)} {k}" for k, v in vals.items()), flush=True)
        if r:
            for name, vals in values.items():
                counted[name].append(vals)
    return counted


def phase_bandwidth(phase: str) -> list[float]:
    return [r["bandwidth_gbs"] for r in ROUNDS if r["phase"] == phase and not r["warmup"]]


def bw_note(phase: str) -> str:
    bws = phase_bandwidth(phase)
    if not bws:
        return ""
    if len(bws) == 1:
        return f"bandwidth {bws[0]:.0f} GB/s (1 round)"
    return f"bandwidth {min(bws):.0f}-{max(bws):.0f} GB/s over {len(bws)} rounds"


def best(runs: list[dict[str, float]], key: str, fastest: Callable[..., Any] = min) -> float:
    return fastest(r[key] for r in runs)


def memory_bandwidth_gbs() -> float:
    """Read bandwidth now, best of 3 sums over 512 MB. On a shared VM it halves when neighbours load the memory
    bus (seen here: 55 and 28 GB/s an hour apart), and every weight-streaming number here moves with it."""
    data = torch.ones(128 * 2**20)
    best = min(timed_once(data.sum) for _ in range(3))
    return data.numel() * 4 / best / 1e9


def timed_once(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t
