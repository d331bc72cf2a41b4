"""The router's exact index: per replica, the set of page keys it caches, kept by its event batches.

Because page keys are chained (a key names its page and every page before it), a set is exact: a request's first
k page keys are all in a replica's set exactly when that replica caches its first k pages. No tree is needed, and
matching costs one set lookup per matched page.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from radixcache.router.errors import RouterError
from radixcache.router.events import EventBatch, PageKey


@dataclass(frozen=True, slots=True)
class IndexStats:
    """Counters since the index was made. `events`: keys stored plus keys removed (plus one per clear)."""

    replicas: int
    pages: int  # keys held now, over all replicas
    batches: int  # batches applied
    events: int
    gaps: int  # batches refused for a sequence gap (each asks for a resync)
    resyncs: int


class RouterIndex:
    """Which page keys each replica caches, and the last event batch applied from it.

    Invariants:
    - A replica's set is exactly what its applied batches (and its last resync) leave: starting from empty at
      `add_replica`, each batch `seq` = last + 1 is applied in full (`EventBatch` says in what order); a batch
      with any other `seq` is refused whole and changes nothing, and the caller resyncs that replica.
    - Only added replicas are indexed: `remove_replica` drops a replica's set at once (a dead replica leaves the
      routing set), and nothing is applied for a replica not in the index.
    Not thread-safe: one owner (the front door's event loop, or the simulator) calls it.
    """

    __slots__ = ("_batches", "_events", "_gaps", "_keys", "_resyncs", "_seq")

    def __init__(self) -> None:
        self._keys: dict[int, set[PageKey]] = {}
        self._seq: dict[int, int] = {}
        self._batches = self._events = self._gaps = self._resyncs = 0

    # ------------------------------------------------------------------ membership

    def add_replica(self, replica: int, seq: int = 0) -> None:
        """Index `replica`, empty, its last batch being `seq` (publishers number batches from 1, so the first
        batch expected is seq + 1). Raises RouterError if it is indexed already."""
        _check_replica(replica)
        _check_seq(seq, 0)
        if replica in self._keys:
            raise RouterError(f"replica {replica} is in the index already")
        self._keys[replica] = set()
        self._seq[replica] = seq

    def remove_replica(self, replica: int) -> bool:
        """Drop `replica` and its keys at once. False (and nothing done) if it was not indexed."""
        if replica not in self._keys:
            return False
        del self._keys[replica]
        del self._seq[replica]
        return True

    def replicas(self) -> tuple[int, ...]:
        """The indexed replicas, in increasing order."""
        return tuple(sorted(self._keys))

    def __contains__(self, replica: object) -> bool:
        return replica in self._keys

    # ------------------------------------------------------------------ events

    def apply(self, batch: EventBatch) -> bool:
        """Apply `batch` if it is its replica's next (seq == last + 1); True when applied.

        False, with nothing changed, when the batch is out of order (the caller must `resync` that replica) or
        its replica is not indexed (`replica in index` tells which). Raises TypeError, with nothing changed, for
        an unhashable key.
        """
        replica = batch.replica
        last = self._seq.get(replica)
        if last is None:
            return False
        if batch.seq != last + 1:
            self._gaps += 1
            return False
        removed = set(batch.removed)  # hashed before anything changes
        stored = set(batch.stored)
        keys = self._keys[replica]
        if batch.cleared:
            keys.clear()
        if removed:
            keys.difference_update(removed)
        keys.update(stored)
        self._seq[replica] = batch.seq
        self._batches += 1
        self._events += batch.events
        return True

    def resync(self, replica: int, seq: int, keys: Iterable[PageKey]) -> None:
        """Replace `replica`'s set with a full snapshot `keys` taken after its batch `seq`; the next batch
        expected is seq + 1. Raises RouterError for a replica not indexed (add it first)."""
        if replica not in self._keys:
            raise RouterError(f"replica {replica} is not in the index: add_replica first")
        _check_seq(seq, 0)
        snapshot = set(keys)
        self._keys[replica] = snapshot
        self._seq[replica] = seq
        self._resyncs += 1

    def last_seq(self, replica: int) -> int:
        """The sequence number of the last batch applied (or resynced to) for `replica`."""
        try:
            return self._seq[replica]
        except KeyError:
            raise RouterError(f"replica {replica} is not in the index") from None

    # ------------------------------------------------------------------ queries

    def matched_pages(self, replica: int, page_keys: Sequence[PageKey]) -> int:
        """How many of `page_keys`, from the first, `replica` holds consecutively: the pages of the request it
        would serve from its cache. O(answer): stops at the first key it lacks. 0 for a replica not indexed."""
        keys = self._keys.get(replica)
        if not keys:
            return 0
        n = 0
        for key in page_keys:
            if key not in keys:
                break
            n += 1
        return n

    def holds(self, replica: int, key: PageKey) -> bool:
        """Whether `replica` holds `key`."""
        keys = self._keys.get(replica)
        return keys is not None and key in keys

    def keys(self, replica: int) -> frozenset[PageKey]:
        """A copy of `replica`'s keys (for tests and snapshots; O(its pages))."""
        return frozenset(self._keys.get(replica, ()))

    def pages(self, replica: int) -> int:
        """Keys `replica` holds (0 if not indexed)."""
        keys = self._keys.get(replica)
        return len(keys) if keys is not None else 0

    def total_pages(self) -> int:
        """Keys held over all replicas."""
        return sum(len(k) for k in self._keys.values())

    def memory_bytes(self) -> int:
        """The index's memory, estimated: each set's table plus each key object (`sys.getsizeof`, keys measured
        one by one, so a key shared by two replicas counts twice, as an upper bound). O(pages)."""
        total = sys.getsizeof(self._keys) + sys.getsizeof(self._seq)
        size = sys.getsizeof
        for keys in self._keys.values():
            total += size(keys) + sum(map(size, keys))
        return total

    @property
    def stats(self) -> IndexStats:
        return IndexStats(len(self._keys), self.total_pages(), self._batches, self._events, self._gaps, self._resyncs)


def _check_replica(replica: object) -> None:
    if type(replica) is not int or replica < 0:
        raise RouterError(f"a replica is a non-negative int, got {replica!r}")


def _check_seq(seq: object, low: int) -> None:
    if type(seq) is not int or seq < low:
        raise RouterError(f"a sequence number is an int >= {low}, got {seq!r}")
