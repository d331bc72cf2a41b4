"""The eviction policy protocol: a strategy mapping an evictable leaf to a sortable priority (smallest first).

See radixcache.policy.classic for the cache's contract and the named policies.
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from radixcache.errors import PolicyError

if TYPE_CHECKING:
    from radixcache.node import TreeNode


class EvictionPolicy(ABC):
    """Strategy object for choosing which unlocked leaf to evict next."""

    name: str = "abstract"
    #: True when the cache must re-rank a leaf after a split or a partial eviction: its priority depends on
    #: which blocks it holds (Belady, dead-block LRU). Otherwise a leaf keeps the priority of its last access: a
    #: reshape is not an access.
    ranks_by_extent: bool = False
    #: True when a leaf's priority, recomputed later with nothing about the leaf changed, may differ from the key
    #: it was given: the policy learns (reuse). The key from the leaf's last access stands until the next one.
    keys_drift: bool = False
    #: True when `priority_at` answers for this policy (one that `ranks_by_extent`): the cache then finds how far to
    #: trim a leaf before another one ranks first by a binary search over `priority_at`, and calls `on_evict` once
    #: per such run of blocks instead of once per block.
    trims_in_bulk: bool = False
    #: True when the cache must call `on_hit` after each prefix match that reads cached pages (reuse learns from
    #: it); off by default, so the other policies cost nothing for it.
    observes_hits: bool = False
    #: The lease hint (microseconds, or None) that the cache stamps on every node its next touches reach, as
    #: `node.hint` (radixcache.policy.lease): a match or insert stamps its path, an unlock the nodes it frees.
    #: Only the lease-hinted policies set it (`expect_reuse_in`); for the others it stays None.
    hint_us: int | None = None

    @abstractmethod
    def priority(self, node: TreeNode) -> tuple:
        """Sort key of an evictable leaf: smaller is evicted sooner."""

    def priority_at(self, node: TreeNode, blocks: int) -> tuple:
        """With `trims_in_bulk`: the leaf's priority were it cut to its first `blocks` blocks (1 <= blocks <= all of
        them; all of them gives `priority(node)`). It must never decrease as `blocks` shrinks."""
        raise NotImplementedError(f"{self.name} does not rank a leaf by a prefix of its blocks")

    def on_evict(self, node: TreeNode, priority: tuple) -> None:  # noqa: B027 - optional hook
        """Called once per leaf as eviction takes blocks from it; stateful policies age themselves here."""

    def on_hit(self, node: TreeNode) -> None:  # noqa: B027 - optional hook
        """Called after a prefix match that ends in `node` (with its access time and hit count already updated),
        when `observes_hits` is set."""


def claim(policy: EvictionPolicy) -> None:
    """Mark `policy` as serving the cache being built; PolicyError if it served a cache before. A policy keeps what it
    saw there (reuse's classes, keyed by that tree's clock; cost's inflation; a lease hint), so a second cache,
    even after the first is gone, started from another run's state: the same object replayed twice gave other
    figures than its name did, with nothing said."""
    layers: list[EvictionPolicy] = []  # a wrapper (the engine's RetentionPolicy) and the policy it ranks by
    layer: object = policy
    while isinstance(layer, EvictionPolicy) and all(layer is not seen for seen in layers):
        layers.append(layer)
        layer = getattr(layer, "base", None)
    for layer in layers:
        if getattr(layer, "_claimed", False):
            raise PolicyError(
                f"this {type(layer).__name__} object already served a cache and keeps what it learned there: each "
                f"cache needs its own (pass the name {layer.name!r}, or a fresh object)"
            )
    for layer in layers:
        with contextlib.suppress(AttributeError):  # a policy class with __slots__ cannot be marked
            layer._claimed = True  # type: ignore[attr-defined]


def check_parameter(where: str, value: object, low: float, *, above: bool = False, high: float = math.inf) -> None:
    """Raise PolicyError, naming `where`, unless `value` is a finite number (not a bool) >= `low` (> `low` when
    `above`) and <= `high`. A plain `value < low` check lets NaN through (every comparison with it is false), and a
    NaN or infinite parameter makes leaves' keys NaN or all alike: the eviction order silently arbitrary."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    try:
        ok = ok and math.isfinite(value) and (value > low if above else value >= low) and value <= high  # type: ignore[arg-type,operator]
    except OverflowError:  # an int past any float
        ok = False
    if not ok:
        bound = f"> {low:g}" if above else f">= {low:g}"
        if high < math.inf:
            bound += f" and <= {high:g}"
        raise PolicyError(f"{where} must be a finite number {bound}, got {value!r}")
