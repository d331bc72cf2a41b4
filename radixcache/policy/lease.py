"""Lease-aware eviction for agent traffic: `tlru` (time-to-live LRU) and `agent` (time to expected reuse).

Both key a leaf from the cache's clock (`node.last_access`; in the simulator with `honor_timestamps` it is the trace
clock in microseconds) and the node's own hint (`node.hint`, microseconds, or None): the hint the caller stated
with `expect_reuse_in(seconds)` (the request's lease hint, `retain_for`) before the node's last touch. The cache
stamps the hint in force on every node a match or an insert reaches (the whole path, with its `last_access`), and
on every node an unlock frees (its last lock released; the lease replay tells None first, so an expired lease's
pages are hint-less). A node shared by several requests (a system prompt, a session's earlier turns) therefore
carries the hint of the request that touched it last, as its `last_access` is that request's time: it is keyed as
that request's own pages are, and keeps that key when its children are evicted and it becomes a leaf, whatever
hint was told since.

- `tlru`: the key is the leaf's deadline, `last_access + ttl`, with `ttl` the request's hint or, without one, the
  fixed `ttl_s` (default 10 s); the earliest deadline goes first. A hit re-keys the leaf (refresh on hit). This is
  SGLang's idea as we understood it from its description (a TTL per prefix, refreshed on hit, LRU among the
  expired); with one fixed TTL for every leaf the order is exactly LRU's.
- `agent`: leaves touched by a request without a hint rank by LRU and go before any leaf with a hint; among leaves
  with a hint, the one whose expected reuse (`last_access + hint`) is farthest goes first (Belady's rule applied
  to the hint). Expiry is not seen by the key (keys are fixed until the next touch): the lease replay
  (radixcache.sim.lease_replay) holds leased pages until their deadline and unlocks them then, which re-keys them
  (the lease's whole path, where no other lock holds it) as hint-less, i.e. LRU. On traces without hints `agent`
  is exactly LRU.
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
        """The hint the next touches stamp on the nodes they reach: reuse expected `seconds` from now, None for no
        hint. Nodes touched before keep the hint they were stamped with."""
        self.hint_us = None if seconds is None else _microseconds(f"{self.name}: a lease hint", seconds)


class TLRUPolicy(_Hinted):
    """Time-to-live LRU: the earliest `last_access + ttl` goes first; a hit refreshes it."""

    name = "tlru"

    def __init__(self, ttl_s: float = 10.0) -> None:
        super().__init__()
        self.ttl_us = _microseconds("tlru: ttl_s", ttl_s)

    def priority(self, node: TreeNode) -> tuple:
        hint = node.hint
        return (node.last_access + (self.ttl_us if hint is None else hint), node.last_access)


class AgentPolicy(_Hinted):
    """Hint-less leaves by LRU first; then hinted leaves, the farthest expected reuse first."""

    name = "agent"

    def priority(self, node: TreeNode) -> tuple:
        hint = node.hint
        if hint is None:
            return (0, node.last_access)
        return (1, -(node.last_access + hint), node.last_access)


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
