"""Belady's offline optimum as an eviction policy: the simulator's bound, never a policy a server can run."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from radixcache.policy.base import EvictionPolicy

if TYPE_CHECKING:
    from radixcache.node import TreeNode


class BeladyPolicy(EvictionPolicy):
    """Belady's offline optimum (MIN): evict the block whose next use is farthest; ties go to the deeper block.

    An offline bound for simulation, not a policy a server can run: `next_use(node)` is an oracle that says
    when the leaf's deepest block is next read (a request position, larger is later; a block read by no later
    request gets a number beyond every position). In a prefix tree a block is never read later than its
    descendants, so comparing leaves by their deepest block is comparing blocks. Not in `POLICIES`: it cannot
    be built without its oracle (see `radixcache.sim.oracle`).

    `next_use_of_block(block)`, when given, says the same of one block: the cache can then rank a leaf cut to its
    first k blocks (`priority_at`) and trim it in one step as far as it still ranks first. Cutting a leaf never
    makes it rank sooner (its new deepest block is read no later, and it ends shallower), which that search needs.
    """

    name = "belady"
    ranks_by_extent = True

    def __init__(
        self, next_use: Callable[[TreeNode], int], next_use_of_block: Callable[[int], int] | None = None
    ) -> None:
        self.next_use = next_use
        self.next_use_of_block = next_use_of_block
        self.trims_in_bulk = next_use_of_block is not None

    def priority(self, node: TreeNode) -> tuple:
        return (-self.next_use(node), -(node.prefix_len + len(node.key)))

    def priority_at(self, node: TreeNode, blocks: int) -> tuple:
        if self.next_use_of_block is None:
            return super().priority_at(node, blocks)
        page = len(node.key) // len(node.blocks)
        return (-self.next_use_of_block(node.blocks[blocks - 1]), -(node.prefix_len + blocks * page))
