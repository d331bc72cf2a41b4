"""The infinite-cache bound over token sequences: how far a query matches anything stored, exactly.

A cache that never evicts holds every page that was ever inserted, so a prompt hits its longest prefix shared with
any sequence inserted before it. Among sequences kept in lexicographic order, the one sharing the longest prefix
with a query is one of the query's two neighbours, so a sorted list (sortedcontainers) answers with a binary search
(memcmp comparisons) and two comparisons, whatever the number of sequences. A sequence that is a prefix of one
inserted after it adds nothing and is dropped, so a conversation that grows turn by turn is kept once.

Sequences are the int64 bytes of their tokens (8 bytes a token): a shared prefix of bytes, cut down to whole
tokens, is a shared prefix of tokens. Unlike hashed page keys, nothing here can collide.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
from sortedcontainers import SortedList

_WIDTH = 8  # bytes per token


class PrefixSet:
    """Token sequences per namespace (`add`), and the longest prefix a query shares with any of them (`longest`)."""

    def __init__(self) -> None:
        self._sets: dict[Hashable, SortedList] = {}

    def longest(self, namespace: Hashable, data: bytes) -> int:
        """Tokens at the start of `data` (int64 bytes) that some sequence added to `namespace` starts with too."""
        stored = self._sets.get(namespace)
        if not stored or not data:
            return 0
        at = stored.bisect_left(data)
        best = 0
        if at < len(stored):
            best = _shared(data, stored[at])
        if at:
            best = max(best, _shared(data, stored[at - 1]))
        return best

    def add(self, namespace: Hashable, data: bytes) -> int:
        """Store `data` (int64 bytes) in `namespace`; returns how many of its tokens were there already."""
        stored = self._sets.get(namespace)
        if stored is None:
            stored = self._sets[namespace] = SortedList()
        if not data:
            return 0
        at = stored.bisect_left(data)
        if at < len(stored) and stored[at].startswith(data):  # a prefix of a stored sequence: nothing new
            return len(data) // _WIDTH
        known = _shared(data, stored[at]) if at < len(stored) else 0
        if at:
            before = stored[at - 1]
            if data.startswith(before):  # it extends the one before it, which then adds nothing
                known = max(known, len(before) // _WIDTH)
                del stored[at - 1]
            else:
                known = max(known, _shared(data, before))
        stored.add(data)
        return known


def _shared(a: bytes, b: bytes) -> int:
    """Tokens at the start of both `a` and `b` (int64 bytes)."""
    n = min(len(a), len(b)) // _WIDTH
    if a[: n * _WIDTH] == b[: n * _WIDTH]:
        return n
    left = np.frombuffer(a, dtype=np.int64, count=n)
    right = np.frombuffer(b, dtype=np.int64, count=n)
    return int(np.argmax(left != right))
