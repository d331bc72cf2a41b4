"""The host tier's recency from device hits: refreshes recorded now, applied in order before the tier's next use.

An admission refreshes the run it found (device pages and loaded pages) in the host tier as in the disk tier, or a
system prompt every request hits on the device is the first page a full host tier evicts. A prompt the device holds
whole is not hashed at admission, so the refresh comes as a function computing the run's hashes (a LaterHashes,
radixcache.page_hash.DeferredHashes). `SharedRun` computes it once for both tiers, on whichever thread needs it
first: the disk's writer (kv.tier.disk_stamps, within 0.1 s), or the loop at the host tier's next use (the next
admission's lookup, a commit's store), off the admission that found it.

Invariants: `HostPageTier` applies the owed refreshes, oldest first, before anything else reads or changes its
recency (a store, touch, lookup, lock, unlock or discard), so the LRU order is the order the uses happened in, and
each refresh puts its run's first page last (`PageTier.touch`: the tier evicts a run from its tail). At most
`MAX_OWED` refreshes wait: one more applies them all first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from radixcache.runtime.kv.tier.disk_stamps import Hashes
from radixcache.tier.page_tier import PageTier

MAX_OWED = 64  # refreshes waiting for the host tier's next use (each holds a run's tokens until hashed)


class SharedRun:
    """A run's hashes computed at most once, on whichever thread asks first (both get the same list)."""

    __slots__ = ("_hashes", "_later", "_pages")

    def __init__(self, later: Callable[[], Sequence[bytes]], pages: int) -> None:
        self._later, self._pages = later, pages
        self._hashes: Sequence[bytes] | None = None

    def __len__(self) -> int:
        return self._pages

    def __call__(self) -> Sequence[bytes]:
        hashes = self._hashes
        if hashes is None:  # two threads may both compute it: the same hashes, either list kept
            hashes = self._hashes = self._later()
        return hashes


def shared(run: Hashes) -> Hashes:
    """`run` for both tiers: hashes as they are; a function computing them, computed once (SharedRun)."""
    return SharedRun(run, len(run)) if callable(run) else run


class HostPageTier(PageTier):
    """The host tier's PageTier, with device hits' refreshes owed (`touch_later`) until its next use."""

    def __init__(self, capacity: int, *, name: str = "host") -> None:
        super().__init__(capacity, name=name)
        self._owed: list[Hashes] = []

    def touch_later(self, run: Hashes) -> None:
        """Refresh `run` (hashes head first, or a function computing them) before the tier's next use."""
        if len(self._owed) >= MAX_OWED:
            self.settle()
        self._owed.append(run)

    def settle(self) -> None:
        """Apply the owed refreshes, oldest first (hashing the runs not hashed yet)."""
        owed, self._owed = self._owed, []
        for run in owed:
            super().touch(run() if callable(run) else run)

    def count_prefix(self, hashes: Sequence[bytes], start: int = 0) -> int:
        if self._owed:
            self.settle()
        return super().count_prefix(hashes, start)

    def touch(self, hashes: Sequence[bytes]) -> None:
        if self._owed:
            self.settle()
        super().touch(hashes)

    def store(self, page_hash: bytes, older_than: bytes | None = None) -> tuple[int, bool] | None:
        if self._owed:
            self.settle()
        return super().store(page_hash, older_than)

    def discard(self, page_hash: bytes) -> bool:
        if self._owed:
            self.settle()
        return super().discard(page_hash)

    def lock(self, hashes: Sequence[bytes]) -> None:
        if self._owed:
            self.settle()
        super().lock(hashes)

    def unlock(self, hashes: Sequence[bytes]) -> None:
        if self._owed:
            self.settle()
        super().unlock(hashes)
