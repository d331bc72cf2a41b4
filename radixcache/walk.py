"""The tree walk: find a query's path down the radix tree, split a node where a match ends inside it, and prove
an insert's blocks on the way down.

`TreeWalk` is the layer of `RadixCache` (radixcache.cache) above the evictable set (radixcache.eviction): a split
or an access re-sorts an evictable leaf. Nothing here allocates or frees a block; `_descend` and
`_insert_fast_path` change nothing at all, so a failed call leaves the tree as it was.

Children are filed by their first page: the token itself at page size 1, else the page's int64 bytes
(`_child_key`). Keys are compared against the query's bytes in place (`bytes.startswith`), one memcmp per node.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from itertools import count

from radixcache.blocks import STATE_NAMES, block_ids
from radixcache.errors import BlockStateError, RadixCacheError
from radixcache.eviction import EvictableSet
from radixcache.node import TreeNode, empty_key
from radixcache.tokens import check_signs, common_prefix_length

# What _descend finds: (node, length, blocks, partial, partial_len), a plain tuple on the hot path.
#   node: the deepest node matched in full; length: tokens matched down to its end; blocks: their block ids;
#   partial: the child matched only in part, if any; partial_len: its tokens matched (page-aligned, > 0 when set).
_Descent = tuple[TreeNode, int, array, "TreeNode | None", int]


class TreeWalk(EvictableSet):
    """The walks over the tree that `match_prefix`, `peek`, `insert` and `lock_prefix` share."""

    _uids: count  # node uids (set in RadixCache.__init__)
    _clock: int  # the logical time (set in RadixCache.__init__)

    def _root(self, namespace: Hashable, *, create: bool = True) -> TreeNode:
        """The namespace's root. Without `create`, an unseen namespace gets a transient empty root that is not
        registered, so lookups under ever-new namespaces (per-user salts) leave nothing behind."""
        try:
            root = self._roots.get(namespace)
        except TypeError:  # dict lookup hashes the namespace first
            raise RadixCacheError(f"namespace must be hashable, got {type(namespace).__name__}") from None
        if root is None:
            root = TreeNode(0, empty_key(), block_ids(), None, namespace, self._clock)  # uid 0 marks a root
            if create:
                self._roots[namespace] = root
        return root

    def _child_key(self, tokens: array, pos: int) -> object:
        p = self.page_size
        return tokens[pos] if p == 1 else tokens[pos : pos + p].tobytes()

    def _descend(self, root: TreeNode, arr: array, buf: bytes | None = None) -> _Descent:
        """Walk down from `root` along `arr` without changing anything. `buf`: `arr.tobytes()`, if the caller has it."""
        p = self.page_size
        n = len(arr)
        if buf is None:
            buf = arr.tobytes()  # node keys are compared against it in place
        node, pos, blocks = root, 0, block_ids()
        while n - pos >= p:
            child = node.children.get(arr[pos] if p == 1 else buf[pos * 8 : (pos + p) * 8])
            if child is None:
                break
            key = child.key
            k = len(key)
            if not buf.startswith(key, pos * 8):  # the common case, a whole node, takes one compare
                k = common_prefix_length(key, arr, pos)
                if p > 1:
                    k -= k % p
                if k < len(key):
                    return node, pos, blocks, child, k
            blocks.extend(child.blocks)
            pos += k
            node = child
        return node, pos, blocks, None, 0

    def _split(self, child: TreeNode, k: int) -> TreeNode:
        """Split `child` after its first k tokens; return the new parent holding them.

        The original object keeps the tail, so a handle to it still ends at the same position.
        """
        p = self.page_size
        parent = child.parent
        assert parent is not None and 0 < k < len(child.key) and k % p == 0
        head = TreeNode(next(self._uids), child.key[:k], child.blocks[: k // p], parent, child.namespace, 0)
        head.lock_ref = child.lock_ref
        head.last_access = child.last_access
        head.created = child.created
        head.hit_count = child.hit_count
        head.hint = child.hint
        parent.children[self._child_key(child.key, 0)] = head
        child.key = child.key[k:]
        child.blocks = child.blocks[k // p :]
        child.parent = head
        child.prefix_len += k
        head.children[self._child_key(child.key, 0)] = child
        # A split is not an access: an evictable child keeps its priority, unless the policy ranks a leaf
        # by the blocks it holds.
        if child.evict_key is not None and self.policy.ranks_by_extent:
            self._set_discard(child)
            self._set_add(child)
        return head

    def _touch(self, node: TreeNode, *, hit: bool) -> None:
        """Refresh access time, lease hint (and hit count) from `node` up to its root, re-sorting `node` if
        evictable."""
        entry = node.evict_key
        clock = self._clock
        hint = self.policy.hint_us
        n = node
        while n.parent is not None:
            n.last_access = clock
            n.hint = hint
            if hit:
                n.hit_count += 1
            n = n.parent
        if entry is not None:  # re-keyed: the old entry goes stale (the inlined _set_discard)
            self._stale += 1
            self._set_add(node)

    def _insert_fast_path(
        self, arr: array, blocks: array, namespace: Hashable, signs_checked: bool
    ) -> tuple[TreeNode, int, TreeNode | None, int, int, list] | None:
        """The walk of an insert whose blocks are proven valid at C speed, or None: take the exact path.

        Proof: `blocks` is a block-id array (so every id is an int), as long as the tokens need, and each page
        is either the tree's own block (the matched pages' blocks compare equal, one memcmp), or held: a run of
        leases from `allocate` (BlockPool.lease_cover). Held ids are distinct and never in the tree, so nothing
        here can be a duplicate, out of range, or owned elsewhere. The walk is `_descend`'s over the full pages;
        it changes nothing, and neither does a failed proof. Unless `signs_checked`, it raises InvalidTokensError
        for a negative token: only the tokens past those the walk found in the tree need the check (the tree
        holds no negative token).
        Returns (node, matched_pages, partial, partial_len, start, cover): blocks[start:] is covered by
        leases; start is 0 when the cached pages come as held duplicates, else matched_pages.
        """
        p = self.page_size
        if len(blocks) != -(-len(arr) // p):
            return None
        try:
            root = self._roots.get(namespace)  # a new namespace takes the exact path, which creates it
        except TypeError:  # an unhashable namespace
            return None
        if root is None:
            return None
        buf = arr.tobytes()  # node keys are compared against it in place, and the signs read from it
        # Full pages only, as in match_prefix: the walk never matches the unaligned tail (it rounds down to pages).
        node, pos, cached, partial, partial_len = self._descend(root, arr, buf)
        if partial is not None:
            cached.extend(partial.blocks[: partial_len // p])
        pages = len(cached)
        own = blocks[:pages] == cached  # one memcmp: every cached page comes as the tree's own block
        if not signs_checked:
            check_signs(arr, pos + partial_len, buf)
        start = pages if own else 0
        cover = self._pool.lease_cover(blocks, start, len(blocks))
        if cover is None:
            return None
        return node, pages, partial, partial_len, start, cover

    def _check_insert_blocks(self, ids: array, cached: array) -> None:
        """Each block must be the tree's own block at its position, or held by the caller."""
        pool = self._pool
        for index, block in enumerate(ids):
            if (index < len(cached) and block == cached[index]) or pool.is_held(block):
                continue
            where = "a cached page" if index < len(cached) else "a new page"
            raise BlockStateError(
                f"insert: block {block} for {where} (index {index}) is {STATE_NAMES[pool.state_of(block)]}"
                + (f"; the tree holds that page in block {cached[index]}" if index < len(cached) else "")
            )
