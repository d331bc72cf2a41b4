"""Prefixes that are on their way into a replica's cache: the page keys of requests routed there and not finished.

The index learns a replica's pages only once its engine has computed them. A request routed now behind others on
the same replica will find their pages cached by the time it runs (requests on a replica start in order; an
engine that shares in-flight prefixes does the same), so a router that ignored them would send a conversation's
next turn, or a burst sharing a new prefix, to a replica that must recompute it. SGLang's router gets this by
inserting each routed prompt into its approximate tree at once. Requests do not always finish in the order they
were routed (a short one behind a long one, a failure, a cancel), so entries are kept by request id where the
caller gives one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence

from radixcache.router.errors import RouterError
from radixcache.router.events import PageKey


class InFlightPrefixes:
    """Per replica, the page keys of the requests routed there and not finished.

    An entry added with a request id (`RouteRequest.rid`) stays exactly as long as `holds(rid)` says that request
    is in flight (the LoadTracker's record), so requests that finish, fail or are cancelled out of order remove
    exactly their own prefixes. Entries added without an id (a caller whose replicas run requests in the order
    they were routed, like the simulator's FIFO queues) keep the older rule: after `sync(r, running)` the last
    `running` of them, less those with ids still in flight, remain. At most `max_per_replica` entries per replica
    (the oldest go first); `_counts[r]` counts each key over r's entries.
    """

    __slots__ = ("_counts", "_entries", "max_per_replica")

    def __init__(self, max_per_replica: int = 256) -> None:
        if type(max_per_replica) is not int or max_per_replica < 0:
            raise RouterError(f"max_per_replica must be an int >= 0, got {max_per_replica!r}")
        self.max_per_replica = max_per_replica
        self._entries: dict[int, deque[tuple[Hashable, tuple[PageKey, ...]]]] = {}
        self._counts: dict[int, dict[PageKey, int]] = {}

    def sync(self, replica: int, running: int, holds: Callable[[Hashable], bool] | None = None) -> None:
        """Keep only `replica`'s requests still in flight: those with an id while `holds(id)`, and of those
        without one the last `running` less the kept ones with an id."""
        entries = self._entries.get(replica)
        if not entries:
            return
        keep: list[bool] = []
        with_id = 0
        for rid, _ in entries:
            if rid is None:
                keep.append(True)
            else:
                alive = holds is None or holds(rid)
                keep.append(alive)
                with_id += alive
        anonymous = max(0, running - with_id)
        for i in range(len(entries) - 1, -1, -1):  # the newest anonymous entries stay
            if entries[i][0] is None:
                if anonymous:
                    anonymous -= 1
                else:
                    keep[i] = False
        if all(keep):
            return
        kept: deque[tuple[Hashable, tuple[PageKey, ...]]] = deque()
        for entry, k in zip(entries, keep, strict=True):
            if k:
                kept.append(entry)
            else:
                self._drop(replica, entry[1])
        self._entries[replica] = kept

    def add(self, replica: int, page_keys: Sequence[PageKey], rid: Hashable = None) -> None:
        """A request (`rid`, or None for one without an id) with `page_keys` was routed to `replica`."""
        entries = self._entries.setdefault(replica, deque())
        counts = self._counts.setdefault(replica, {})
        keys = tuple(page_keys)
        entries.append((rid, keys))
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
        while len(entries) > self.max_per_replica:
            self._drop(replica, entries.popleft()[1])

    def finished(self, replica: int, rid: Hashable) -> bool:
        """Request `rid` left `replica` (finished, failed or cancelled): its entry goes now. False if none."""
        entries = self._entries.get(replica)
        if not entries or rid is None:
            return False
        for i, entry in enumerate(entries):
            if entry[0] == rid:
                del entries[i]
                self._drop(replica, entry[1])
                return True
        return False

    def _drop(self, replica: int, keys: tuple[PageKey, ...]) -> None:
        counts = self._counts[replica]
        for key in keys:
            n = counts[key] - 1
            if n:
                counts[key] = n
            else:
                del counts[key]

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
