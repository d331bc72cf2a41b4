"""The disk store's maintenance (kv.tier.disk_store's DiskStore inherits them): a snapshot of its index and
counters (`stats`), the check of every page file (`verify`) and the deletion of every page (`clear`), what the
`radixcache cache` commands run. Reads and changes the store's index, counters and queue under its lock, as the
store's own methods do."""

from __future__ import annotations

import contextlib
import threading

from radixcache.runtime.kv.tier.disk_index import PageIndex
from radixcache.runtime.kv.tier.disk_layout import CacheDir
from radixcache.runtime.kv.tier.disk_reports import DiskStoreStats, VerifyReport, remove_file, verify_pages
from radixcache.runtime.kv.tier.disk_writer import WriteQueue


class DiskMaintenance:
    """`stats`, `verify` and `clear` of a DiskStore, over the state it sets up (declared here)."""

    directory: str
    max_bytes: int
    enabled: bool
    layout: CacheDir
    _lock: threading.Lock
    _index: PageIndex
    _names: dict[str, str]
    _count: dict[str, int]
    _queue: WriteQueue
    lost_writes: int

    def stats(self) -> DiskStoreStats:
        """A snapshot of the index and the counters."""
        with self._lock:
            index = self._index
            names = {tag: self._names.get(tag, f"?{tag}") for tag in index.tag_pages}
            return DiskStoreStats(
                directory=self.directory,
                pages=len(index),
                bytes=index.bytes,
                max_bytes=self.max_bytes,
                enabled=self.enabled,
                pending_writes=len(self._queue),
                fingerprints={names[tag]: n for tag, n in sorted(index.tag_pages.items())},
                fingerprint_bytes={names[tag]: n for tag, n in sorted(index.tag_bytes.items())},
                **self._count,
            )

    def verify(self, *, delete: bool = True) -> VerifyReport:
        """Read and check every page file on disk: magic, version, checksum, header, length, that the recorded
        hash is the file's name (and sits in its first byte's folder), and that the recorded fingerprint is its
        folder's. Corrupt files are deleted (and leave the index) when `delete`. Never raises for I/O reasons;
        a file that cannot be read counts as corrupt, one that cannot be deleted as not removed."""
        return verify_pages(self.layout, lambda hash_hex, path: self._corrupt_found(hash_hex, path, delete))

    def _corrupt_found(self, hash_hex: str, path: str, delete: bool) -> bool:
        """Count a page file `verify` found corrupt; when `delete`, delete it and its index entry. Whether deleted."""
        with self._lock:
            self._count["corrupt_pages"] += 1
        if not delete or not remove_file(path):
            return False
        with self._lock, contextlib.suppress(ValueError):
            page_hash = bytes.fromhex(hash_hex)
            entry = self._index.get(page_hash)
            if entry is not None and entry.path == path:
                self._index.drop(page_hash, entry)
        return True

    def clear(self) -> int:
        """Delete every page file and temporary file (and discard queued writes); return how many pages.

        Raises ValueError naming the directory when it lacks the marker file (it is not a radixcache cache) or
        holds another format; OSError when a file cannot be deleted. A write already in progress may still land.
        """
        try:
            self.layout.check_marker(strict=True)
            self.layout.check_own_folders()
        except ValueError as exc:
            raise ValueError(f"refusing to clear {self.directory}: {exc}") from None
        with self._lock:
            discarded = self._queue.discard_queued()
            self._count["dropped_writes"] += discarded
            self.lost_writes += discarded
        count = self.layout.remove_page_files()
        with self._lock:
            self._index.clear()
        return count
