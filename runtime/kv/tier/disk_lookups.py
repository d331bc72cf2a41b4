"""The disk store's lookups (kv.tier.disk_store's DiskStore inherits them): how many of a run's pages are stored
(the index's, then one `lstat` a page past it, on kv.tier.disk_probe's thread: another process's writes), whether one
is held, the index entries of files deleted behind the store's back dropped (an `lstat` a page, there too), device
hits' refreshes recorded (settled off the loop thread: kv.tier.disk_stamps), and one page read and checked against
the index (kv.tier.disk_reads). Reads and changes the store's index and counters under its lock, as the store's own
methods do; no file I/O under it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from radixcache.runtime.kv.tier.disk_files import SplitRead, read_nofollow_split
from radixcache.runtime.kv.tier.disk_index import PageIndex, probe_pages
from radixcache.runtime.kv.tier.disk_layout import CacheDir
from radixcache.runtime.kv.tier.disk_probe import FileProbe
from radixcache.runtime.kv.tier.disk_reads import load_page, load_page_into, read_indexed
from radixcache.runtime.kv.tier.disk_stamps import Hashes, OwedRefreshes
from radixcache.runtime.kv.tier.disk_writer import WriteQueue

T = TypeVar("T")


class DiskLookups:
    """`count_prefix`, `holds`, `forget_missing`, `refresh`, `read` and `read_into` of a DiskStore, over the state it
    sets up (declared here)."""

    layout: CacheDir
    _lock: threading.Lock
    _index: PageIndex
    _owed: OwedRefreshes
    _queue: WriteQueue
    _count: dict[str, int]
    _readable: bool
    _probe: FileProbe
    _unlinking: int
    _deletions: int

    def count_prefix(self, page_hashes: Sequence[bytes]) -> int:
        """How many of `page_hashes`, from the first, are stored consecutively. O(answer): the index's, then one
        `lstat` a page past it (kv.tier.disk_index's `probe_pages`, without the lock, on the probe's thread: a stuck
        file system holds the caller, the engine loop, at most kv.tier.disk_probe's bound): a page file another
        process sharing the directory wrote after this store opened joins the index, with its mtime as its stamp."""
        with self._lock:
            n = self._index.prefix_length(page_hashes)
            deletions = None if self._unlinking else self._deletions
        if n == len(page_hashes) or not self._readable or deletions is None or self._probe.absent(page_hashes[n]):
            return n
        answered, found = self._probe.look(lambda: probe_pages(self.layout, page_hashes[n:]))
        if not answered:  # a stuck file system: never waited for past the probe's bound (kv.tier.disk_probe)
            return n
        if n + len(found) < len(page_hashes):
            self._probe.note_absent(page_hashes[n + len(found)])
        with self._lock:
            if found and deletions == self._deletions:  # else a file found may be one this store is deleting
                now = self._owed.now()
                for page_hash, entry, mtime_ns in found:
                    if entry.path in self._index.left_out:  # a file it dropped on purpose: the run ends there
                        break
                    if page_hash not in self._index:
                        self._index.add(page_hash, entry, min(mtime_ns, now))
            return self._index.prefix_length(page_hashes)

    def __contains__(self, page_hash: object) -> bool:
        with self._lock:
            return page_hash in self._index

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    def holds(self, page_hash: bytes) -> bool:
        """Whether the page is stored, or its write is queued (a `put` of it is refused: it is being written)."""
        with self._lock:
            return page_hash in self._index or page_hash in self._queue

    def forget_missing(self, page_hashes: Sequence[bytes]) -> int:
        """Drop the index entries of these pages whose files are gone (deleted behind this store's back: a `cache
        clear`, another process's eviction), so that they are written again when next adopted; how many. One
        `lstat` per page, without the lock, on the probe's thread (0 when it does not answer in time)."""
        with self._lock:
            entries = [(h, e) for h in page_hashes if (e := self._index.get(h)) is not None]
        answered, gone = self._probe.look(lambda: [(h, e) for h, e in entries if not os.path.lexists(e.path)])
        if not answered or not gone:  # (not answered: a stuck file system, not waited for; kv.tier.disk_probe)
            return 0
        with self._lock:
            for page_hash, entry in gone:
                self._index.drop(page_hash, entry)
        return len(gone)

    def refresh(self, page_hashes: Hashes) -> None:
        """Pages hit on the device (their hashes, head first, or a function computing them): the most recently used,
        the first last, so that the size limit deletes a run's later pages before those it starts with; their mtimes
        too (head newest), for the order after a restart. No hashing or I/O here: settled before the next write, at
        `flush` and at `close` (kv.tier.disk_stamps), and by the writer thread within SETTLE_S without writes."""
        with self._lock:
            self._owed.record(page_hashes)
            self._queue.wake()

    def _settle(self) -> None:
        """Settle the refreshes recorded before the first write not yet in the index was queued (with none, all): a
        page is refreshed after its write, and a write queued after a refresh is the newer."""
        self._owed.settle(self._index, self._lock, lambda: self._queue.first_unwritten_ns(self._index))

    def read(self, page_hash: bytes, tokens: Sequence[int]) -> tuple[memoryview, dict] | None:
        """The page's payload (a writable view of the bytes read) and metadata, or None when it is absent or fails
        a check.

        `tokens` are the page's own token ids, compared with those stored: a hash alone is never trusted. A page
        that fails any check (magic, version, checksum, recorded hash, tokens, length) is deleted from disk and
        the index, counted in `corrupt_pages` and logged as a warning. A hit makes the page the most recently
        used, in memory and by its mtime (so that the order survives a restart).
        """
        return self._read(page_hash, lambda path: load_page(path, page_hash, tokens))

    def read_into(
        self,
        page_hash: bytes,
        tokens: Sequence[int],
        payload: Sequence[memoryview],
        head: bytearray,
        split: SplitRead = read_nofollow_split,
        mtime_ns: int | None = None,
    ) -> dict | None:
        """`read`, with the payload read straight into `payload` (writable buffers whose lengths sum to the page's
        payload, filled in order) and the file's other bytes into `head` (grown as needed; a reader reuses one) by
        `split` (kv.tier.disk_files.read_nofollow_split's contract): no copy. Returns the page's metadata; None as
        `read` does, and also (without deleting anything) for a sound page whose payload is not that long.
        `payload` holds garbage after a None. `mtime_ns`: the mtime a hit gets (None: now; kv.tier.prefetch)."""
        return self._read(page_hash, lambda p: load_page_into(p, page_hash, tokens, payload, head, split), mtime_ns)

    def _read(self, page_hash: bytes, load: Callable[[str], T | None], mtime_ns: int | None = None) -> T | None:
        """The read of one page against the index (kv.tier.disk_reads.read_indexed)."""
        return read_indexed(self._index, self._lock, self._count, page_hash, load, mtime_ns, self._owed.now)
