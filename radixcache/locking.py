"""Locking: a reference count on a node's whole path, so that a matched prefix survives eviction while in use.

`Locking` is the layer of `RadixCache` (radixcache.cache) above the tree walk (radixcache.walk): `lock_prefix`
walks and splits, and `unlock` puts a leaf whose count drops to zero back into the evictable set
(radixcache.eviction).

Invariants: a node's `lock_ref` is its own locks (`own_locks`) plus its children's `lock_ref`, so the count of a
path is read at its deepest node; a node with `lock_ref > 0` is out of the evictable set and its blocks count as
locked, not evictable. A namespace root is never locked: locking it is a no-op.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Sequence

from radixcache.errors import LockError, RadixCacheError
from radixcache.node import TreeNode
from radixcache.tokens import token_view
from radixcache.walk import TreeWalk


class Locking(TreeWalk):
    """`lock`, `lock_prefix` and `unlock`, and the counters they move between evictable and locked."""

    # ------------------------------------------------------------------ public API

    def lock(self, node: TreeNode) -> None:
        """Protect `node` and every ancestor from eviction (a reference count on the whole path)."""
        if type(node) is not TreeNode:
            self._raise_not_a_node(node, "lock")
        if node.parent is None and self._is_root(node):  # (raises for an evicted node)
            return
        self._check_owner(node)
        node.own_locks += 1
        n, moved = node, 0
        while n.parent is not None:
            if n.lock_ref == 0:
                moved += len(n.blocks)
                if n.evict_key is not None:  # out of the evictable set: its entry goes stale (the inlined _set_discard)
                    n.evict_key = None
                    self._stale += 1
            n.lock_ref += 1
            n = n.parent
        self._evictable -= moved  # blocks of nodes that just became locked
        self._tree_locked += moved

    def lock_prefix(self, tokens: Sequence[int], num_tokens: int, *, namespace: Hashable = None) -> TreeNode | None:
        """Lock exactly the first `num_tokens` of `tokens` (a pin); return the node to pass to `unlock`.

        `num_tokens` must be an int, a positive multiple of page_size, and at most `len(tokens)`; else
        RadixCacheError. When the tree holds all of those tokens, the node holding position `num_tokens` is
        split so that a node ends exactly there (unless one already does), and that node is locked: its tail,
        if any, stays evictable. When fewer tokens are cached (or the namespace is unseen), returns None and
        changes nothing: no split, no root.
        Not a query: no stats, no clock tick, no access time or hit count. Raises InvalidTokensError for bad
        tokens and RadixCacheError for an unhashable namespace, with nothing changed.
        """
        arr = token_view(tokens)  # read during the call only
        n = self._pin_length(num_tokens, len(arr))
        root = self._root(namespace, create=False)  # an unseen namespace: a transient root with no children
        node, length, _, partial, partial_len = self._descend(root, arr[:n])  # stops at n: n is page-aligned
        if partial is not None:
            if length + partial_len < n:  # the match ends inside `partial`, short of n
                return None
            node = self._split(partial, partial_len)  # a node now ends at n; the tail keeps its priority
        elif length < n:
            return None
        # Invariant: node.end_len == n, and node is not a root (n > 0), so the lock is real.
        self.lock(node)
        return node

    def unlock(self, node: TreeNode) -> None:
        """Undo one `lock(node)`. Raises LockError, with nothing changed, if the node is not locked.

        The nodes whose last lock this releases take the policy's lease hint told now (`policy.hint_us`)."""
        if type(node) is not TreeNode:
            self._raise_not_a_node(node, "unlock")
        if node.parent is None and self._is_root(node):  # (raises for an evicted node)
            return
        self._check_owner(node)
        # lock_ref also counts locks taken on descendants: only the node's own locks may be undone here.
        # Ancestors count at least as many locks, so checking the node suffices.
        if node.own_locks <= 0:
            raise LockError(f"unlock: {node!r} is not locked")
        node.own_locks -= 1
        n, moved, hint = node, 0, self.policy.hint_us
        while n.parent is not None:
            n.lock_ref -= 1
            if n.lock_ref == 0:  # its last lock goes: it takes the hint told now (a lease's release: None)
                moved += len(n.blocks)
                n.hint = hint
                if not n.children:
                    self._set_add(n)
            n = n.parent
        self._evictable += moved  # blocks of nodes that just became unlocked
        self._tree_locked -= moved

    # ------------------------------------------------------------------ private

    @staticmethod
    def _raise_not_a_node(node: object, what: str) -> None:
        """LockError for a `node` argument that is no TreeNode (None was an AttributeError from inside the walk)."""
        if node is None:
            got = "None (lock_prefix returns None when the prefix is not cached)"
        elif type(node).__name__ == "MatchResult":
            got = "a MatchResult (pass its .node)"
        else:
            got = f"a {type(node).__name__}"
        raise LockError(f"{what}: node must be a TreeNode (a MatchResult's .node), got {got}")

    def _is_root(self, node: TreeNode) -> bool:
        if node.parent is not None:
            return False
        if node.uid == 0:  # a root (maybe transient or dropped): holds no blocks, so locking it is a no-op
            return True
        raise LockError(f"{node!r} has been evicted (or belongs to another cache); match again")

    def _check_owner(self, node: TreeNode) -> None:
        """LockError unless `node` hangs from one of this cache's roots: another cache's node would move this
        cache's counters and the other tree's reference counts, breaking both."""
        root = node.parent
        while root.parent is not None:
            root = root.parent
        if self._roots.get(root.namespace) is not root:
            raise LockError(f"{node!r} belongs to another cache")

    def _pin_length(self, num_tokens: int, available: int) -> int:
        """Validate lock_prefix's `num_tokens`: an int (not a bool), a positive multiple of page_size,
        at most the tokens given."""
        p = self.page_size
        try:
            if type(num_tokens) is bool:  # an int to operator.index, but never a token count
                raise TypeError
            n = operator.index(num_tokens)
        except TypeError:
            raise RadixCacheError(f"lock_prefix: num_tokens must be an int, got {num_tokens!r}") from None
        if n <= 0 or n % p:
            raise RadixCacheError(
                f"lock_prefix: num_tokens must be a positive multiple of page_size {p}, got {num_tokens!r}"
            )
        if n > available:
            raise RadixCacheError(f"lock_prefix: num_tokens {num_tokens!r} exceeds the {available} tokens given")
        return n
