"""Cache statistics: counters kept by the cache, and the frozen snapshot handed to callers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters since the cache was created (or `reset_stats`). Token counts, as vLLM reports them.

    queries: match_prefix calls. query_tokens: tokens looked up. hit_tokens: of those, tokens found cached.
    inserted_tokens: tokens newly added to the tree by insert. evicted_blocks / evicted_tokens: removed by
    eviction. evictions: leaves (or leaf tails) evicted.
    """

    queries: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    inserted_tokens: int = 0
    evicted_blocks: int = 0
    evicted_tokens: int = 0
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        """hit_tokens / query_tokens (0.0 before any query)."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class StatsCounter:
    """Mutable counters owned by one cache."""

    __slots__ = (
        "evicted_blocks",
        "evicted_tokens",
        "evictions",
        "hit_tokens",
        "inserted_tokens",
        "queries",
        "query_tokens",
    )

    def __init__(self) -> None:
        self.queries = self.query_tokens = self.hit_tokens = 0
        self.inserted_tokens = self.evicted_blocks = self.evicted_tokens = self.evictions = 0

    def snapshot(self) -> CacheStats:
        return CacheStats(**{name: getattr(self, name) for name in self.__slots__})


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), interpolating linearly between order statistics; 0.0 for no values.

    Raises ValueError for a q that is no number in [0, 100] (NaN, a bool, 150: past 100 it indexed past the end).
    """
    if isinstance(q, bool) or not isinstance(q, Real) or not 0 <= q <= 100:
        raise ValueError(f"percentile: q must be a number in [0, 100], got {q!r}")
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)
