"""What the prefill chunks of one scheduler step may still take: prompt tokens, and (while requests decode, when
`SchedulerConfig.mixed_prefill_attention` is set) attention work, counted in query tokens times the positions each
attends, so that a chunk over a long cached prefix is cut over several steps (engine.scheduler).

The first chunk of a step always gets at least one token, whatever its attention costs: a prefix longer than the
bound never blocks its request. The bound counts work per query, not the cost of a step: reading a long prefix's KV
is paid again by every step that attends over it (docs/tiers.md, "Measured").
"""

from __future__ import annotations

import math


def check_attention_bound(value: object) -> None:
    """Refuse a `mixed_prefill_attention` that is not None (no bound) or an int >= 1."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(
            "mixed_prefill_attention must be None (no bound) or an int >= 1 (query tokens x positions attended per "
            f"step while requests decode), got {value!r}"
        )


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
    """One step's prefill budget: `tokens` left, `work` left (None: unbounded), at most `chunk` tokens a request."""

    def __init__(self, tokens: int, chunk: int, work: int | None = None) -> None:
        self.tokens = tokens
        self.chunk = chunk
        self.work = work

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
