"""Prefixes that are on their way into a replica's cache: the page keys of requests routed there and not finished.

The index learns a replica's pages only once its engine has computed them. A request routed now behind others on
the same replica will find their pages cached by the time it runs (requests on a replica start in order; an
engine that shares in-flight prefixes does the same), so a router that ignored them would send a conversation's
next turn, or a burst sharing a new prefix, to a replica that must recompute it. SGLang's router gets this by
inserting each routed prompt into its approximate tree at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from radixcache.router.events import PageKey


class InFlightPrefixes:
    """Per replica, the page keys of the last requests routed there, trimmed to the requests still in flight.

    Invariant: after `sync(r, running)`, replica r's entries are the page keys of the last `running` requests
    `add`ed for r (at most `max_per_replica`), and `_counts[r]` counts each key over them. Requests finish in the
    order they were routed to a replica (its queue is FIFO), so the last `running` are the ones in flight.
    """

    __slots__ = ("_counts", "_entries", "max_per_replica")

    def __init__(self, max_per_replica: int = 256) -> None:
        self.max_per_replica = max_per_replica
        self._entries: dict[int, deque[tuple[PageKey, ...]]] = {}
        self._counts: dict[int, dict[PageKey, int]] = {}

    def sync(self, replica: int, running: int) -> None:
        """Keep only `replica`'s last `running` requests (those still in flight)."""
        entries = self._entries.get(replica)
        if not entries:
            return
        counts = self._counts[replica]
        while len(entries) > running:
            for key in entries.popleft():
                n = counts[key] - 1
                if n:
                    counts[key] = n
                else:
                    del counts[key]

    def add(self, replica: int, page_keys: Sequence[PageKey]) -> None:
        """A request with `page_keys` was routed to `replica`."""
        entries = self._entries.setdefault(replica, deque())
        counts = self._counts.setdefault(replica, {})
        keys = tuple(page_keys)
        entries.append(keys)
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
        if len(entries) > self.max_per_replica:
            self.sync(replica, self.max_per_replica)

    def matched_pages(self, replica: int, page_keys: Sequence[PageKey]) -> int:
        """How many of `page_keys`, from the first, requests in flight on `replica` will have cached."""
        counts = self._counts.get(replica)
        if not counts:
            return 0
        n = 0
        for key in page_keys:
            if key not in counts:
                break
            n += 1
        return n

    def pages(self, replica: int) -> int:
        """Distinct page keys in flight on `replica`."""
        return len(self._counts.get(replica, ()))

    def forget(self, replica: int) -> None:
        self._entries.pop(replica, None)
        self._counts.pop(replica, None)
