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
        nxt, prv = self._next, self._prev
        prev = prv[after]
        nxt[prev], prv[key], nxt[key], prv[after] = key, prev, after, key

    def remove(self, key: Hashable) -> None:
        """Take `key` out (KeyError when absent)."""
        prev = self._prev.pop(key)
        nxt = self._next.pop(key)
        self._next[prev] = nxt
        self._prev[nxt] = prev

    def move(self, key: Hashable, before: Hashable | None = None) -> None:
        """Make `key` (present) the newest, or just older than `before` (present, not `key`)."""
        nxt, prv = self._next, self._prev
        prev, after = prv[key], nxt[key]
        nxt[prev], prv[after] = after, prev
        after = _END if before is None else before
        prev = prv[after]
        nxt[prev], prv[key], nxt[key], prv[after] = key, prev, after, key

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

    def run_to_newest(self, keys: Iterable[Hashable]) -> None:
        """`to_newest(reversed(keys))` (the present keys the newest, the first of them last), with a run's pages that
        lie together in order (`keys[i + 1]` just older than `keys[i]`, as `insert(key, before=parent)` lays a run
        out) moved as one block: a lookup a page to see that, and one splice a block, where a move a page cost 3
        lookups and 6 stores (this is every refresh and lookup of a tier: the bulk of its bookkeeping)."""
        nxt, prv = self._next, self._prev
        blocks: list[tuple[object, object]] = []  # (newest, oldest) of each block, the first key's block first
        newest = oldest = None
        for key in keys:
            if key not in nxt:
                continue
            if oldest is not None and prv[oldest] == key:
                oldest = key
                continue
            if newest is not None:
                blocks.append((newest, oldest))
            newest = oldest = key
        if newest is None:
            return
        blocks.append((newest, oldest))
        for newest, oldest in reversed(blocks):  # the last block to the newest end first: the first ends newest
            after = nxt[newest]
            if after is _END:
                continue  # the newest already
            before, last = prv[oldest], prv[_END]
            nxt[before], prv[after] = after, before
            nxt[last], prv[oldest], nxt[newest], prv[_END] = oldest, last, _END, newest

    def oldest(self) -> Hashable | None:
        key = self._next[_END]
        return None if key is _END else key  # type: ignore[return-value]

    def pop_oldest_unless(self, keep: Hashable | None) -> Hashable | None:
        """Remove and return the least recently used key, unless there is none or it is `keep` (then None)."""
        nxt = self._next
        key = nxt[_END]
        if key is _END or (keep is not None and key == keep):
            return None
        prv = self._prev
        del prv[key]
        after = nxt.pop(key)
        nxt[_END], prv[after] = after, _END
        return key  # type: ignore[return-value]

    def pop_oldest(self) -> Hashable:
        """Remove and return the least recently used key (KeyError when empty)."""
        nxt, prv = self._next, self._prev
        key = nxt[_END]
        if key is _END:
            raise KeyError("pop from an empty order")
        del prv[key]
        after = nxt.pop(key)
        nxt[_END], prv[after] = after, _END
        return key  # type: ignore[return-value]
