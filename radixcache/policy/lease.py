"""Lease-aware eviction for agent traffic: `tlru` (time-to-live LRU) and `agent` (time to expected reuse).

Both key a leaf when it is touched (inserted, matched, unlocked) from the cache's clock (`node.last_access`; in
the simulator with `honor_timestamps` it is the trace clock in microseconds) and a TTL in microseconds that the
caller states before the touch with `expect_reuse_in(seconds)` (the request's lease hint, `retain_for`), or None.

- `tlru`: the key is the leaf's deadline, `last_access + ttl`, with `ttl` the request's hint or, without one, the
  fixed `ttl_s` (default 10 s); the earliest deadline goes first. A hit re-keys the leaf (refresh on hit). This is
  SGLang's idea as we understood it from its description (a TTL per prefix, refreshed on hit, LRU among the
  expired); with one fixed TTL for every leaf the order is exactly LRU's.
- `agent`: leaves touched by a request without a hint rank by LRU and go before any leaf with a hint; among leaves
  with a hint, the one whose expected reuse (`last_access + hint`) is farthest goes first (Belady's rule applied
  to the hint). Expiry is not seen by the key (keys are fixed until the next touch): the lease replay
  (radixcache.sim.lease_replay) holds leased pages until their deadline and unlocks them then, which re-keys them
  as hint-less, i.e. LRU. On traces without hints `agent` is exactly LRU.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from radixcache.errors import PolicyError
from radixcache.policy.base import EvictionPolicy

if TYPE_CHECKING:
    from radixcache.node import TreeNode


class _Hinted(EvictionPolicy):
    def __init__(self) -> None:
        self.hint_us: int | None = None

    def expect_reuse_in(self, seconds: float | None) -> None:
        """The hint for the leaves the next touches key: reuse expected `seconds` from now, None for no hint."""
        self.hint_us = None if seconds is None else _microseconds(f"{self.name}: a lease hint", seconds)


class TLRUPolicy(_Hinted):
    """Time-to-live LRU: the earliest `last_access + ttl` goes first; a hit refreshes it."""

    name = "tlru"

    def __init__(self, ttl_s: float = 10.0) -> None:
        super().__init__()
        self.ttl_us = _microseconds("tlru: ttl_s", ttl_s)

    def priority(self, node: TreeNode) -> tuple:
        ttl = self.ttl_us if self.hint_us is None else self.hint_us
        return (node.last_access + ttl, node.last_access)


class AgentPolicy(_Hinted):
    """Hint-less leaves by LRU first; then hinted leaves, the farthest expected reuse first."""

    name = "agent"

    def priority(self, node: TreeNode) -> tuple:
        if self.hint_us is None:
            return (0, node.last_access)
        return (1, -(node.last_access + self.hint_us), node.last_access)


def _microseconds(what: str, seconds: object) -> int:
    """`seconds` in microseconds, the clock's unit. A PolicyError naming `what` unless it is a finite number >= 0
    whose microseconds are finite: an infinite one has no int to key a leaf by (round() raised OverflowError)."""
    try:
        ok = not isinstance(seconds, bool) and 0 <= seconds < math.inf and math.isfinite(seconds * 1e6)  # type: ignore[operator]
    except (TypeError, OverflowError):  # not a number; an int past any float
        ok = False
    if not ok:
        raise PolicyError(f"{what} must be a finite number of seconds >= 0, got {seconds!r}")
    return round(seconds * 1e6)  # type: ignore[operator]
