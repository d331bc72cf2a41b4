"""Eviction policies: each maps an evictable leaf to a sortable priority; the smallest is evicted first.

The cache keeps its evictable leaves in a heap ordered by `(policy.priority(node), node.uid)`. A priority is
computed when a leaf enters the set (it becomes a leaf, or is unlocked) and again whenever it is accessed. A
split or a partial eviction is not an access and keeps the priority, unless the policy sets `ranks_by_extent`.
Each cache owns its policy instance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixcache.errors import PolicyError
from radixcache.policy.base import EvictionPolicy, check_parameter

if TYPE_CHECKING:
    from radixcache.node import TreeNode


class LRUPolicy(EvictionPolicy):
    """Least recently used: the leaf accessed longest ago goes first."""

    name = "lru"

    def priority(self, node: TreeNode) -> tuple:
        return (node.last_access,)


class LFUPolicy(EvictionPolicy):
    """Least frequently used: fewest prefix hits first, ties broken by recency."""

    name = "lfu"

    def priority(self, node: TreeNode) -> tuple:
        return (node.hit_count, node.last_access)


class FIFOPolicy(EvictionPolicy):
    """First in, first out: the leaf inserted earliest goes first, however often it is hit."""

    name = "fifo"

    def priority(self, node: TreeNode) -> tuple:
        return (node.created, node.last_access)


class SLRUPolicy(EvictionPolicy):
    """Segmented LRU: leaves hit fewer than `protect_after` times (the probation segment) go before any
    protected leaf; LRU within each segment.

    In chat and agent workloads most one-off turns are hit at most once, while system prompts and shared
    tool definitions are hit again and again. SLRU keeps a burst of one-off requests from flushing those.
    Unlike textbook SLRU, the protected segment has no size cap: it is demoted only by running out of
    probation leaves.
    """

    name = "slru"

    def __init__(self, protect_after: int = 2) -> None:
        if type(protect_after) is not int or protect_after < 1:  # NaN passed `< 1`: nothing was ever protected
            raise PolicyError(f"slru: protect_after must be an int >= 1, got {protect_after!r}")
        self.protect_after = protect_after

    def priority(self, node: TreeNode) -> tuple:
        return (node.hit_count >= self.protect_after, node.last_access)


class CostAwarePolicy(EvictionPolicy):
    """GreedyDual-Size-Frequency over recompute cost: keeps leaves that are expensive to recompute and often hit.

    Recomputing a block costs MLP work plus attention over everything before it, so a block at depth d
    (tokens) costs about `1 + d / attention_scale`. A leaf's value is `inflation + (hits + 1) * cost`, where
    cost is the mean per-block cost over the leaf. Evicting a leaf raises `inflation` to its value, which ages
    every leaf that is not accessed again (GreedyDual's clock), so stale but deep prefixes still go eventually.
    """

    name = "cost"

    def __init__(self, attention_scale: float = 4096.0) -> None:
        check_parameter("cost: attention_scale", attention_scale, 0, above=True)
        self.attention_scale = attention_scale
        self.inflation = 0.0

    def priority(self, node: TreeNode) -> tuple:
        mid_depth = node.prefix_len + len(node.key) / 2
        cost = 1.0 + mid_depth / self.attention_scale
        return (self.inflation + (node.hit_count + 1) * cost, node.last_access)

    def on_evict(self, node: TreeNode, priority: tuple) -> None:
        self.inflation = max(self.inflation, priority[0])
