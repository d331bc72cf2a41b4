"""Retention priority: an eviction policy wrapper that keeps marked prefixes longer.

A request may give its prompt a retention priority r > 0 (a system prompt every agent uses, say). Every leaf that
starts inside a marked prefix sorts before nothing of lower r: the cache evicts all leaves of retention 0 first,
in the base policy's order, then those of retention 1, and so on. Unlike a pin, this is soft: under pressure a
retained prefix is still evicted rather than failing a request.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from radixcache import EvictionPolicy, TreeNode, make_policy

MAX_MARKS = 256  # the oldest marks go first beyond this


class RetentionPolicy(EvictionPolicy):
    """`base`'s order, preceded by the retention priority of the marked prefix a leaf starts in (0 if none)."""

    def __init__(self, base: str | EvictionPolicy = "lru") -> None:
        self.base = make_policy(base)
        self.name = self.base.name
        self.ranks_by_extent = self.base.ranks_by_extent
        self._marks: dict[tuple[Hashable, tuple[int, ...]], int] = {}

    def mark(self, namespace: Hashable, tokens: Sequence[int], priority: int) -> None:
        """Leaves that start inside `tokens` (in `namespace`) get `priority` (the highest mark wins)."""
        key = (namespace, tuple(tokens))
        self._marks.pop(key, None)
        if priority > 0:
            self._marks[key] = priority
            while len(self._marks) > MAX_MARKS:
                del self._marks[next(iter(self._marks))]

    def clear(self) -> int:
        n = len(self._marks)
        self._marks.clear()
        return n

    @property
    def marks(self) -> int:
        return len(self._marks)

    def priority(self, node: TreeNode) -> tuple:
        base = self.base.priority(node)
        return (self._retention(node) if self._marks else 0, *base)

    def on_evict(self, node: TreeNode, priority: tuple) -> None:
        self.base.on_evict(node, priority[1:])

    def _retention(self, node: TreeNode) -> int:
        best = 0
        path: list[int] | None = None
        for (namespace, tokens), r in self._marks.items():
            if r <= best or namespace != node.namespace or len(tokens) <= node.prefix_len:
                continue
            if path is None:
                path = node.tokens()
            n = min(len(tokens), len(path))
            if list(tokens[:n]) == path[:n]:
                best = r
        return best
