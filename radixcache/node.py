"""A node of the radix tree: one span of tokens and the blocks that hold their KV."""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from itertools import count
from typing import Any

from radixcache.tokens import TOKEN_TYPECODE

_EMPTY = array(TOKEN_TYPECODE)


class TreeNode:
    """One edge of the radix tree, with the span of tokens it covers.

    Invariants (checked by `RadixCache.check_invariants`):
    - `len(key) == len(blocks) * page_size`; a non-root node's key is never empty.
    - `children` maps the child's first page (`child_key(...)`) to the child, and `child.parent is self`.
    - `lock_ref` counts the locks held on this node or any descendant: it equals `own_locks` (the `lock` calls
      made on this node itself and not yet undone) plus the sum of its children's. A node with `lock_ref > 0` is
      never evicted.
    - `prefix_len` is the number of tokens on the path above this node.
    - `hint` is the lease hint (microseconds, or None) in force at the node's last touch: the match or insert that
      set `last_access`, or the unlock that released its last lock (radixcache.policy.lease says why).
    A namespace root has `parent is None`, an empty key, and is never locked, evicted or counted.
    """

    __slots__ = (
        "blocks",
        "children",
        "created",
        "evict_key",
        "hint",
        "hit_count",
        "key",
        "last_access",
        "lock_ref",
        "namespace",
        "own_locks",
        "parent",
        "prefix_len",
        "uid",
    )

    def __init__(
        self,
        uid: int,
        key: array,
        blocks: array,
        parent: TreeNode | None,
        namespace: Hashable,
        clock: int,
    ) -> None:
        self.uid = uid  # unique and increasing: the final tie-break of every eviction order
        self.key = key
        self.blocks = blocks
        self.parent = parent
        self.children: dict[Any, TreeNode] = {}
        self.namespace = namespace
        self.prefix_len = 0 if parent is None else parent.prefix_len + len(parent.key)
        self.lock_ref = 0
        self.own_locks = 0  # `unlock` may undo only these (a split leaves them with the tail, the handle)
        self.last_access = clock
        self.created = clock
        self.hit_count = 0
        self.hint: int | None = None  # the lease hint its last touch stamped (the tlru and agent policies rank by it)
        self.evict_key: tuple | None = None  # the entry in the evictable set, while the node is in it

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def end_len(self) -> int:
        """Number of tokens from the namespace root to the end of this node."""
        return self.prefix_len + len(self.key)

    def tokens(self) -> list[int]:
        """The full token path from the namespace root to the end of this node."""
        parts: list[array] = []
        node: TreeNode | None = self
        while node is not None:
            parts.append(node.key)
            node = node.parent
        out: list[int] = []
        for part in reversed(parts):
            out.extend(part)
        return out

    def __repr__(self) -> str:
        return (
            f"TreeNode(uid={self.uid}, tokens={len(self.key)}, blocks={len(self.blocks)}, "
            f"lock_ref={self.lock_ref}, children={len(self.children)}, namespace={self.namespace!r})"
        )


def new_node_ids() -> count:
    """A fresh uid counter; each cache owns one, so there is no global state."""
    return count(1)


def empty_key() -> array:
    return array(TOKEN_TYPECODE, _EMPTY)


def path_blocks(node: TreeNode, start: int, page_size: int) -> list[int]:
    """The tree's blocks for positions `start .. node.end_len` of the path ending at `node`, read upwards (only
    the nodes of the newly committed span are visited, never the whole path from the root)."""
    parts: list[list[int]] = []
    n: TreeNode | None = node
    while n is not None and n.parent is not None and n.end_len > start:
        skip = max(0, start - n.prefix_len) // page_size
        parts.append(n.blocks[skip:])
        n = n.parent
    return [b for part in reversed(parts) for b in part]
