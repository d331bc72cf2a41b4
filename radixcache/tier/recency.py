"""An order of use that a page can join anywhere, not only at its newest end (PageTier's LRU).

A run's pages reach a tier over several commits (each prefill chunk, each decode page), and a run is found from its
head, so the tier must evict a run's later pages first: each new page goes just older than the run's page before it
(`insert(key, before=parent)`), and the run keeps the recency of its last use without being refreshed at each commit
(that refresh cost O(run) per page: quadratic in a long decode). OrderedDict cannot insert in the middle; this is a
doubly linked list kept in two dicts, every operation O(1).

Invariants: `_next` and `_prev` hold the same keys, the sentinel `_END` included; following `_next` from `_END`
visits every key once, least recently used first, and returns to `_END`; `_prev` is its inverse.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator

_END = object()  # the sentinel before the oldest key and after the newest


class RecencyOrder:
    """Keys, least recently used first; `insert` and `move` place a key newest, or just older than another key."""

    __slots__ = ("_next", "_prev")

    def __init__(self) -> None:
        self._next: dict[object, object] = {_END: _END}
        self._prev: dict[object, object] = {_END: _END}

    def __len__(self) -> int:
        return len(self._next) - 1

    def __bool__(self) -> bool:
        return len(self._next) > 1

    def __contains__(self, key: object) -> bool:
        return key in self._next

    def __iter__(self) -> Iterator[Hashable]:
        nxt = self._next
        key = nxt[_END]
        while key is not _END:
            yield key  # type: ignore[misc]
            key = nxt[key]

    def insert(self, key: Hashable, before: Hashable | None = None) -> None:
        """Add `key` (absent) as the newest, or just older than `before` (present)."""
        after = _END if before is None else before
        prev = self._prev[after]
        self._next[prev] = key
        self._prev[key] = prev
        self._next[key] = after
        self._prev[after] = key

    def remove(self, key: Hashable) -> None:
        """Take `key` out (KeyError when absent)."""
        prev = self._prev.pop(key)
        nxt = self._next.pop(key)
        self._next[prev] = nxt
        self._prev[nxt] = prev

    def move(self, key: Hashable, before: Hashable | None = None) -> None:
        """Make `key` (present) the newest, or just older than `before` (present, not `key`)."""
        self.remove(key)
        self.insert(key, before)

    def to_newest(self, keys: Iterable[Hashable]) -> None:
        """Make each of `keys` that is present the newest, in turn (the last one given ends newest): `move` inlined,
        for a tier's refresh of a run."""
        nxt, prv = self._next, self._prev
        for key in keys:
            if key in nxt:
                prev, after = prv[key], nxt[key]
                nxt[prev], prv[after] = after, prev
                last = prv[_END]
                nxt[last], prv[key], nxt[key], prv[_END] = key, last, _END, key

    def oldest(self) -> Hashable | None:
        key = self._next[_END]
        return None if key is _END else key  # type: ignore[return-value]

    def pop_oldest(self) -> Hashable:
        """Remove and return the least recently used key (KeyError when empty)."""
        key = self._next[_END]
        if key is _END:
            raise KeyError("pop from an empty order")
        self.remove(key)  # type: ignore[arg-type]
        return key  # type: ignore[return-value]
