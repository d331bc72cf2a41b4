"""Retention priority: an eviction policy wrapper that keeps marked prefixes longer.

A request may give its prompt a retention priority r > 0 (a system prompt every agent uses, say). Every leaf that
starts inside a marked prefix sorts before nothing of lower r: the cache evicts all leaves of retention 0 first,
in the base policy's order, then those of retention 1, and so on. Unlike a pin, this is soft: under pressure a
retained prefix is still evicted rather than failing a request.

Precisely, a node's retention is the highest r among the marks (namespace, tokens, r) of its namespace with
len(tokens) > node.prefix_len whose tokens agree with the node's full token path on their common length (one is a
prefix of the other), or 0 if there is none.

The marks are indexed per namespace by a compressed token trie (`_MarkNode`), so that ranking a leaf walks the
leaf's path through the trie once instead of comparing it with every mark: its cost grows with the path's length
(C-speed slice comparisons) and the number of trie branch points on that path, not with the number of marks.
Being an exact trie over the tokens, it has no hash collisions to verify.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence
from typing import NamedTuple

from radixcache import EvictionPolicy, TreeNode, make_policy
from radixcache.tokens import TOKEN_TYPECODE, as_token_array, common_prefix_length

MAX_MARKS = 256  # the oldest marks go first beyond this

_TOKEN_LIMIT = 2**63  # tree tokens are non-negative int64s (radixcache.tokens)


class _Mark(NamedTuple):
    priority: int
    tokens: array  # the mark's tokens up to the first one no tree token can equal (all of them if none)
    cut: bool  # True when tokens stop short of the mark: it then applies only to paths no longer than tokens


class _MarkNode:
    """A node of a namespace's mark trie: an edge of tokens ending at `depth` tokens from the namespace root.

    `exact` holds the marks whose tokens end here; `cut` the marks whose representable tokens end here, followed
    by a token that no tree node holds (so they reach no deeper path). `best` is the highest priority of any mark
    here or below, `deepest` the largest depth at which a mark here or below ends (0 if none).
    """

    __slots__ = ("best", "children", "cut", "deepest", "depth", "edge", "exact", "parent", "r")

    def __init__(self, edge: array, depth: int, parent: _MarkNode | None) -> None:
        self.edge = edge
        self.depth = depth
        self.parent = parent
        self.children: dict[int, _MarkNode] = {}
        self.exact: dict[tuple, int] = {}
        self.cut: dict[tuple, int] = {}
        self.r = 0  # the highest priority in `exact`
        self.best = 0
        self.deepest = 0

    def refresh(self) -> None:
        """Recompute r, best and deepest from this node's marks and its children's aggregates."""
        self.r = max(self.exact.values(), default=0)
        best = max(self.r, max(self.cut.values(), default=0))
        deepest = self.depth if self.exact or self.cut else 0
        for child in self.children.values():
            if child.best > best:
                best = child.best
            if child.deepest > deepest:
                deepest = child.deepest
        self.best = best
        self.deepest = deepest


def _canonical(tokens: tuple) -> tuple[array, bool]:
    """The mark's tokens as an int64 array, cut before the first token that equals no tree token (negative, too
    large, not a number), with whether it was cut. A token equal to an int (1.0, True) counts as that int."""
    try:
        return as_token_array(tokens), False
    except Exception:  # InvalidTokensError, or whatever an odd token's __index__ raises: the slow path decides
        pass
    out = array(TOKEN_TYPECODE)
    for token in tokens:
        try:
            value = int(token)
            ok = 0 <= value < _TOKEN_LIMIT and bool(token == value)
        except Exception:  # int() or == of an arbitrary object: it equals no tree token
            ok = False
        if not ok:
            return out, True
        out.append(value)
    return out, False


def _path(node: TreeNode) -> array:
    """The node's full token path (TreeNode.tokens()), as an int64 array: copies at C speed, boxes no int."""
    parts = []
    n: TreeNode | None = node
    while n is not None:
        parts.append(n.key)
        n = n.parent
    out = array(TOKEN_TYPECODE)
    for part in reversed(parts):
        out += part
    return out


class RetentionPolicy(EvictionPolicy):
    """`base`'s order, preceded by the retention priority of the marked prefix a leaf starts in (0 if none)."""

    def __init__(self, base: str | EvictionPolicy = "lru") -> None:
        self.base = make_policy(base)
        self.name = self.base.name
        self.ranks_by_extent = self.base.ranks_by_extent
        self.observes_hits = self.base.observes_hits
        if hasattr(self.base, "expect_reuse_in"):  # a lease-hinted base (tlru, agent) is told its hints through us
            self.expect_reuse_in = self.base.expect_reuse_in
        self._marks: dict[tuple[Hashable, tuple], _Mark] = {}  # in insertion order: the oldest goes first
        self._tries: dict[Hashable, _MarkNode] = {}  # namespace -> the root of its mark trie

    def mark(self, namespace: Hashable, tokens: Sequence[int], priority: int) -> None:
        """Leaves that start inside `tokens` (in `namespace`) get `priority` (the highest mark wins)."""
        key = (namespace, tuple(tokens))
        old = self._marks.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        if priority > 0:
            arr, cut = _canonical(key[1])
            entry = _Mark(priority, arr, cut)
            self._marks[key] = entry
            self._index(key, entry)
            while len(self._marks) > MAX_MARKS:
                oldest = next(iter(self._marks))
                self._unindex(oldest, self._marks.pop(oldest))

    @property
    def hint_us(self) -> int | None:  # type: ignore[override]  # the base's: the cache stamps what the policy holds
        return self.base.hint_us

    def clear(self) -> int:
        n = len(self._marks)
        self._marks.clear()
        self._tries.clear()
        return n

    @property
    def marks(self) -> int:
        return len(self._marks)

    def priority(self, node: TreeNode) -> tuple:
        base = self.base.priority(node)
        return (self._retention(node) if self._tries else 0, *base)

    def on_evict(self, node: TreeNode, priority: tuple) -> None:
        self.base.on_evict(node, priority[1:])

    def on_hit(self, node: TreeNode) -> None:
        self.base.on_hit(node)

    # ------------------------------------------------------------------ the lookup

    def _retention(self, node: TreeNode) -> int:
        t = self._tries.get(node.namespace)
        if t is None:
            return 0
        p = node.prefix_len
        if p and t.deepest <= p:  # every mark ends at or above the node's start (p == 0 may be the root node)
            return 0
        path = _path(node)
        n = len(path)
        depth = best = 0
        while True:  # t is a trie node at `depth` tokens whose path equals path[:depth]
            if depth == n:  # every mark here or below has the node's path as a prefix
                if n <= p:  # a namespace root (or an empty node): the marks ending here are no longer than p
                    return max(best, *t.cut.values(), *(child.best for child in t.children.values()))
                return t.best if t.best > best else best
            if depth > p and t.r > best:  # a mark that ends inside the node (p < depth < n) and is a prefix
                best = t.r
            if t.best <= best:
                return best
            child = t.children.get(path[depth])
            if child is None:
                return best
            edge = child.edge
            end = depth + len(edge)
            if end <= n:
                if path[depth:end] != edge:  # the marks below diverge from the path before it ends
                    return best
                t, depth = child, end
            else:  # the path ends inside this edge: every mark below is longer and applies iff the edge agrees
                if child.best > best and path[depth:] == edge[: n - depth]:
                    best = child.best
                return best

    # ------------------------------------------------------------------ the index

    def _index(self, key: tuple[Hashable, tuple], entry: _Mark) -> None:
        arr = entry.tokens
        if not arr and not entry.cut:  # an empty mark is longer than no prefix: it applies to nothing
            return
        namespace = key[0]
        t = self._tries.get(namespace)
        if t is None:
            t = self._tries[namespace] = _MarkNode(array(TOKEN_TYPECODE), 0, None)
        depth, n = 0, len(arr)
        while depth < n:
            child = t.children.get(arr[depth])
            if child is None:
                leaf = _MarkNode(arr[depth:], n, t)
                t.children[arr[depth]] = leaf
                t, depth = leaf, n
                break
            edge = child.edge
            k = common_prefix_length(edge, arr, depth)
            if k < len(edge):  # split the edge after its first k tokens (k >= 1: the first token matched)
                mid = _MarkNode(edge[:k], depth + k, t)
                t.children[edge[0]] = mid
                child.edge = edge[k:]
                child.parent = mid
                mid.children[child.edge[0]] = child
                mid.refresh()
                child = mid
            t, depth = child, depth + k
        (t.cut if entry.cut else t.exact)[key] = entry.priority
        while t is not None:
            t.refresh()
            t = t.parent

    def _unindex(self, key: tuple[Hashable, tuple], entry: _Mark) -> None:
        arr = entry.tokens
        if not arr and not entry.cut:
            return
        namespace = key[0]
        root = self._tries[namespace]
        t, depth = root, 0
        while depth < len(arr):
            t = t.children[arr[depth]]
            depth += len(t.edge)
        del (t.cut if entry.cut else t.exact)[key]
        # Prune: drop nodes left with no mark and no child, then merge a markless node with one child into it.
        while t.parent is not None and not t.exact and not t.cut and not t.children:
            parent = t.parent
            del parent.children[t.edge[0]]
            t = parent
        if t.parent is not None and not t.exact and not t.cut and len(t.children) == 1:
            (child,) = t.children.values()
            child.edge = t.edge + child.edge
            child.parent = t.parent
            t.parent.children[t.edge[0]] = child
            t = t.parent
        if t is root and not root.children and not root.exact and not root.cut:
            del self._tries[namespace]
            return
        while t is not None:
            t.refresh()
            t = t.parent
