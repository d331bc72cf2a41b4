"""A full structural check of a RadixCache, for tests and debugging. O(tokens + blocks) per call."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from radixcache.blocks import BLOCK_TYPECODE, FREE, HELD, IN_TREE

if TYPE_CHECKING:
    from radixcache.cache import RadixCache
    from radixcache.node import TreeNode


def _require(condition: bool, message: str) -> None:
    if not condition:  # explicit raise: `assert` vanishes under python -O
        raise AssertionError(message)


def check_invariants(cache: RadixCache) -> None:
    """Raise AssertionError with a message on the first violated invariant."""
    p = cache.page_size
    pool = cache._pool
    owner: dict[int, int] = {}  # block -> uid of the node that holds it
    evictable = locked = 0
    expected_leaves: set[int] = set()

    for namespace, root in cache._roots.items():
        _require(root.parent is None and len(root.key) == 0 and not root.blocks, f"root {namespace!r} malformed")
        _require(
            root.lock_ref == root.own_locks == 0 and root.evict_key is None,
            f"root {namespace!r} is locked or evictable",
        )
        stack: list[TreeNode] = [root]
        while stack:
            node = stack.pop()
            child_lock_sum = 0
            for child_key, child in node.children.items():
                _require(child.parent is node, f"{child!r}: parent link broken")
                _require(cache._child_key(child.key, 0) == child_key, f"{child!r}: filed under the wrong key")
                # `is` first, as the roots' dict compares keys: a namespace unequal to itself (NaN) is still its own
                same = child.namespace is namespace or child.namespace == namespace
                _require(same, f"{child!r}: namespace differs from its root's")
                child_lock_sum += child.lock_ref
                stack.append(child)
            if node is root:
                continue
            _check_node(node, p, child_lock_sum)
            _require(
                type(node.blocks) is array and node.blocks.typecode == BLOCK_TYPECODE,
                f"{node!r}: blocks are not a block-id array",
            )
            for block in node.blocks:
                _require(block not in owner, f"block {block} is owned by nodes {owner.get(block)} and {node.uid}")
                owner[block] = node.uid
            if node.lock_ref > 0:
                locked += len(node.blocks)
            else:
                evictable += len(node.blocks)
                if not node.children:
                    expected_leaves.add(node.uid)

    # Over the ids ever handed out (O(blocks used), not O(capacity)): every id past them is free, never used.
    fresh = pool.fresh
    _require(all(0 <= b < fresh for b in owner), f"a tree block is outside the {fresh} ids handed out")
    state = pool.state
    in_tree = state.count(IN_TREE)
    held = state.count(HELD)
    freed = pool.freed()
    _require(in_tree == len(owner), f"{in_tree} blocks marked in-tree, but the tree holds {len(owner)}")
    _require(all(state[b] == IN_TREE for b in owner), "a tree block is not marked in-tree")
    _require(held == pool.held, f"held counter {pool.held} != {held} blocks marked held")
    _require(len(set(freed)) == len(freed), "the free list repeats a block")
    _require(all(0 <= b < fresh and state[b] == FREE for b in freed), "the free list holds a block not marked free")
    _require(len(freed) == state.count(FREE), "a free block is missing from the free list")
    _require(pool.free_count == len(freed) + pool.capacity - fresh, "the free count is not the free list's length")
    _require(cache._evictable == evictable, f"evictable counter {cache._evictable} != {evictable} in the tree")
    _require(cache._tree_locked == locked, f"locked counter {cache._tree_locked} != {locked} in the tree")
    total = cache.free_blocks + cache.evictable_blocks + cache.locked_blocks
    _require(total == cache.capacity_blocks, f"free+evictable+locked = {total} != {cache.capacity_blocks}")

    # The evictable set is a heap with lazy deletion: its live entries (those that are their node's evict_key)
    # must be exactly the unlocked non-root leaves, each once; every other entry is counted as stale.
    heap = cache._evictable_leaves
    entries = cache._evictable_entries()
    actual_leaves = {entry[1] for entry in entries}
    _require(len(actual_leaves) == len(entries), "the evictable set lists a node twice")
    _require(actual_leaves == expected_leaves, "the evictable set differs from the unlocked leaves")
    for entry in entries:
        _require(entry[1] == entry[3].uid, f"{entry[3]!r}: its evictable entry carries another uid")
    _require(cache._stale == len(heap) - len(entries), f"stale counter {cache._stale} != {len(heap) - len(entries)}")
    _require(all(heap[(i - 1) // 2] <= heap[i] for i in range(1, len(heap))), "the evictable heap is out of order")


def _check_node(node: TreeNode, p: int, child_lock_sum: int) -> None:
    parent = node.parent
    assert parent is not None
    _require(len(node.key) > 0, f"{node!r}: empty key")
    _require(len(node.key) == len(node.blocks) * p, f"{node!r}: {len(node.key)} tokens for {len(node.blocks)} pages")
    _require(
        node.own_locks >= 0 and node.lock_ref == node.own_locks + child_lock_sum,
        f"{node!r}: lock_ref is not its {node.own_locks} own locks plus its children's {child_lock_sum}",
    )
    _require(node.prefix_len == parent.prefix_len + len(parent.key), f"{node!r}: prefix_len out of date")
    if node.lock_ref > 0 or node.children:
        _require(node.evict_key is None, f"{node!r}: in the evictable set while locked or internal")
