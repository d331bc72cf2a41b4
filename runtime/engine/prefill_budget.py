"""What the prefill chunks of one scheduler step may still take: prompt tokens, and (while requests decode, when
`SchedulerConfig.mixed_prefill_attention` is set) attention work, counted in query tokens times the positions each
attends, so that a chunk over a long cached prefix is cut over several steps (engine.scheduler).

The first chunk of a step always gets at least one token, whatever its attention costs: a prefix longer than the
bound never blocks its request. The bound counts work per query, not the cost of a step: reading a long prefix's KV
is paid again by every step that attends over it (docs/tiers.md, "Measured").

Staging cuts such a chunk by layers instead (`SchedulerConfig.staged_prefill_attention`, model.staged): beside
decodes, a chunk whose attention work is over the bound runs its decoder layers over `ceil(work / bound)` passes,
each layer's read of the prefix paid once. `StagedChunk` is where such a chunk stands between passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def check_attention_bound(value: object, name: str = "mixed_prefill_attention") -> None:
    """Refuse an attention bound (`name`) that is not None (no bound) or an int >= 1."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(
            f"{name} must be None (no bound) or an int >= 1 (query tokens x positions attended per "
            f"step while requests decode), got {value!r}"
        )


@dataclass(frozen=True, slots=True)
class StagedChunk:
    """A chunk of `tokens` prompt positions run over several passes by layers (model.staged): the next pass runs
    layers `[next_layer, stop)`, entering with `hidden` (its rows after layer `next_layer - 1`; None at layer 0).
    `per_pass`: layers a pass runs beside decodes. Its positions are not computed (`kv.num_kv`) until it is done."""

    tokens: int
    per_pass: int
    next_layer: int = 0
    stop: int = 0
    hidden: torch.Tensor | None = None


def layers_per_pass(work: int, bound: int, num_layers: int) -> int:
    """Decoder layers a pass runs of a chunk of attention `work` beside decodes, so that a pass spends about `bound`
    of it: all of them when the work fits, else the layers spread evenly over `ceil(work / bound)` passes."""
    passes = min(num_layers, -(-work // bound))
    return -(-num_layers // passes)


def chunk_attention(start: int, n: int) -> int:
    """Attention work of a chunk of `n` tokens after `start` cached positions: query i attends `start + i + 1`
    positions (the prefix, and the chunk causally), n * start + n * (n + 1) / 2 in all."""
    return n * start + n * (n + 1) // 2


def tokens_within_attention(start: int, work: int) -> int:
    """The most tokens of a chunk after `start` cached positions whose `chunk_attention` fits `work` (may be 0)."""
    if work < 1:
        return 0
    b = 2 * start + 1  # n * n + b * n <= 2 * work
    n = (math.isqrt(b * b + 8 * work) - b) // 2
    while chunk_attention(start, n + 1) <= work:  # isqrt rounds down: settle the integer exactly
        n += 1
    while n > 0 and chunk_attention(start, n) > work:
        n -= 1
    return n


class StepBudget:
    """One step's prefill budget: `tokens` left, `work` left (None: unbounded), at most `chunk` tokens a request;
    `stage`: the attention work over which a chunk is staged by layers this step (None: never)."""

    def __init__(self, tokens: int, chunk: int, work: int | None = None, stage: int | None = None) -> None:
        self.tokens = tokens
        self.chunk = chunk
        self.work = work
        self.stage = stage

    @property
    def spent(self) -> bool:
        return self.tokens <= 0 or (self.work is not None and self.work <= 0)

    def size(self, start: int, lacking: int, first: bool) -> int:
        """Tokens a request at `start` that lacks `lacking` may compute now; the step's `first` chunk gets >= 1."""
        n = min(lacking, self.tokens, self.chunk)
        if self.work is not None and n > 0:
            n = min(n, max(1 if first else 0, tokens_within_attention(start, self.work)))
        return n

    def take(self, start: int, n: int) -> None:
        self.tokens -= n
        if self.work is not None:
            self.work -= chunk_attention(start, n)

    def staging(self, start: int, n: int, num_layers: int) -> StagedChunk | None:
        """How a chunk of `n` tokens after `start` cached positions is staged this step (None: in one pass)."""
        work = chunk_attention(start, n)
        if self.stage is None or work <= self.stage:
            return None
        per_pass = layers_per_pass(work, self.stage, num_layers)
        return None if per_pass >= num_layers else StagedChunk(n, per_pass, 0, per_pass)
