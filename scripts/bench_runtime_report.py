"""bench_runtime.py's report: the targets, and the result rows that every phase writes.

`row` prints a result at once and keeps it in `ROWS`, for the closing table and the JSON; module-level because one
run of the script is one report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DECODE_B1_TARGET = 25.0  # tok/s, fp32
DECODE_B8_TARGET = 100.0  # tok/s aggregate, fp32
LLAMA_CPP_FACTOR = 1.5  # a compressed-weight mode's batch-1 decode within 1.5x of llama.cpp (the stretch target)
# issue 33, idle machine, batch 1: fp32 >= 1.5x transformers and >= 80% of the bandwidth bound; gguf >= llama.cpp
HF_FACTOR = 1.5
BOUND_SHARE = 0.8
GGUF_VS_LLAMA_CPP = 1.0


@dataclass
class Row:
    metric: str
    ours: str
    base: str
    note: str
    data: dict[str, Any] = field(default_factory=dict)


ROWS: list[Row] = []


def row(metric: str, ours: str, base: str = "", note: str = "", **data: Any) -> None:
    ROWS.append(Row(metric, ours, base, note, data))
    print(f"  {metric}: {ours}  {base}  {note}", flush=True)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def fmt_ratio(ours: float, base: float | None, name: str) -> str:
    return f"{ours / base:.2f}x {name}" if base else f"{name} n/a"
