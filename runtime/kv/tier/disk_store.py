"""The disk tier's page store: KV pages on disk, content-addressed by their chained page hash.

A restarted server finds the pages it wrote before. The store knows nothing of torch or of how a hash is made:
a page hash is opaque `bytes` (the runtime's 16-byte chained hash, whose root already fingerprints the model,
weight format, KV dtype, page size, layout, rope and namespace), the KV payload is plain `bytes`, and `meta` is a
small JSON-able dict (e.g. `{"dtype": "float32", "shape": [30, 2, 16, 3, 64]}`) that only the runtime interprets.

This module is the front; the pieces behind it, one concern each:
- `disk_layout`: the directory layout, the marker that makes a directory ours, the cleanup of leftovers;
- `disk_files`: durable atomic writes, reads that follow no symlink, the store's temporary file names;
- `disk_index`: which pages exist, their sizes and order of use, built at open from names and `stat`;
- `disk_stamps`: device hits' refreshes of the index and of the files' mtimes, settled off the loop thread;
- `disk_writer`: the atomic write of one page file and the background thread that drains the queue;
- `disk_format`: the bytes of one page file (self-describing and checksummed);
- `disk_reads`: one page file read and checked, whole or with its payload into the caller's buffers, and what the
  read does to the index (a miss, a corrupt page deleted, a hit refreshed);
- `disk_probe`: the lookups' `lstat`s, on a thread of their own, waited for a bounded time (a stuck file system);
- `disk_lookups`: `count_prefix`, `holds`, `forget_missing`, `refresh`, `read` and `read_into`, the store's methods
  that find, refresh and read pages (`DiskStore` inherits them);
- `disk_reports`: what `stats` and `verify` return, and the check of every page file `verify` makes;
- `disk_maintenance`: `stats`, `verify` and `clear`, the store's methods that inspect or empty the directory.

Invariants:

- A page file is only ever created complete (written under `tmp/`, fsynced, renamed into place, its folder fsynced),
  so a reader never sees a partial page. A process killed mid-write leaves a temporary file, which the next open
  removes (unless the process that wrote it is still alive and the file is less than an hour old).
- `read` and `read_into` trust nothing: magic, version, checksum, the hash recorded in the file, and the page's
  own tokens must all match, or the page is deleted, counted as corrupt, and the read is a miss. A page of a newer
  format version (a newer radixcache shares the directory) is a miss that leaves the index, not the disk, and so
  does a page its permissions make unreadable (EACCES, EPERM), or whose reads failed 3 times in a row (EIO: a bad
  sector), until a `put` of it writes it again in its place.
- The index follows this store's own writes, reads and deletions, and the page files a lookup finds past it (another
  process's writes: `count_prefix`). Its byte total is kept at or under `max_bytes`
  at open (a writable store) and after every write by deleting the least recently used pages (last read, write or
  device hit, by the stamps the files' mtimes hold, so the order at open is the order before: `refresh`,
  kv.tier.disk_stamps; a run's later page is stamped just older than the page before it, kv.tier.disk_index).
- No call raises for I/O reasons. An open that cannot create or write the directory, and a write that fails
  (EROFS, EACCES, EFBIG, ...), disable the store (`enabled` False, one warning on the "radixcache.disk" logger): it
  accepts no more writes, but still serves the pages already on disk. A write that finds the disk full (ENOSPC,
  EDQUOT) first deletes the least recently used pages (a few pages' worth, as the size limit would) and tries again;
  only when that cannot help it pauses writing (`backoff`: kv.tier.disk_writer's WriteBackoff), until a later write
  succeeds, and so does an open of a marked directory on a full disk (the first write then makes the folders
  first). A folder at one page's path drops that page's write alone (a warning): the store goes on.
- A directory without the marker that holds anything but the store's own temporary files is never adopted (the
  store opens disabled), and `clear` refuses one. Only files of the store's exact naming, in a marked directory,
  are ever deleted (radixcache.runtime.kv.tier.disk_layout), and no symlink is followed.

Several processes may share a directory (files are immutable, written atomically, verified on read): each finds the
pages the others write (a lookup looks past its index on disk), but enforces `max_bytes` over the pages it knows of:
its own writes, what was there when it opened, and the others' pages its lookups found.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence

from radixcache.runtime.kv.tier.disk_files import FULL_ERRNOS
from radixcache.runtime.kv.tier.disk_format import FORMAT_VERSION, PageWrite, encode_page
from radixcache.runtime.kv.tier.disk_index import PageEntry, PageIndex, clamp_future, scan_pages
from radixcache.runtime.kv.tier.disk_layout import MARKER_NAME, CacheDir, cache_path, fingerprint_tag, warn_if_foreign
from radixcache.runtime.kv.tier.disk_lookups import DiskLookups
from radixcache.runtime.kv.tier.disk_maintenance import DiskMaintenance
from radixcache.runtime.kv.tier.disk_probe import FileProbe
from radixcache.runtime.kv.tier.disk_reports import DiskStoreStats, VerifyReport
from radixcache.runtime.kv.tier.disk_stamps import OwedRefreshes, set_mtimes
from radixcache.runtime.kv.tier.disk_writer import (
    PagePathTaken,
    PageWriteLost,
    WriteBackoff,
    WriteQueue,
    wait_bound,
    write_page_file,
)

__all__ = [
    "FORMAT_VERSION",
    "MARKER_NAME",
    "DiskStore",
    "DiskStoreStats",
    "VerifyReport",
    "fingerprint_tag",
]

log = logging.getLogger("radixcache.disk")

ROOM_PAGES = 4  # a write that finds the disk full deletes this many times its size of the oldest pages, then retries

_COUNTERS = ("writes", "dropped_writes", "read_hits", "read_misses", "corrupt_pages", "evicted_pages")


class DiskStore(DiskLookups, DiskMaintenance):
    """Pages on disk, addressed by page hash, bounded by `max_bytes`, written by one background thread.

    Thread-safety: `count_prefix`, `read`, `read_into`, `put`, `stats` may be called from any thread while the
    writer thread writes; one lock guards the index, the queue and the counters, and no file I/O happens under it.
    No call raises for I/O reasons (see the module docstring); bad arguments (a hash that is not 1-64 bytes, token
    ids outside int64, a meta that is not JSON-able) raise ValueError / TypeError from `put`.

    directory: created if needed ("~" is the home folder). max_bytes: the most bytes of page files kept (>= 0).
    fingerprint: recorded in every page this store writes, and the name its pages are counted under. max_pending: the
    most writes queued at once (0 drops every write). create: False opens an existing cache only (ValueError if
    `directory` is not one), writes nothing at open and accepts no writes: the CLI's way to inspect a directory.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int,
        fingerprint: str = "",
        max_pending: int = 256,
        create: bool = True,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if max_pending < 0:
            raise ValueError(f"max_pending must be >= 0, got {max_pending}")
        self.directory = cache_path(directory)  # "~/kv": the home folder's (ValueError without one)
        self.max_bytes = int(max_bytes)
        self.max_pending = int(max_pending)
        self.fingerprint = str(fingerprint)
        self.tag = fingerprint_tag(self.fingerprint)
        self.layout = CacheDir(self.directory, self.tag)
        self.marker_path, self.pages_root = self.layout.marker_path, self.layout.pages_root
        self.pages_dir, self.tmp_dir = self.layout.pages_dir, self.layout.tmp_dir

        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified when a write finishes or the queue changes
        self._index = PageIndex()
        self._owed = OwedRefreshes()  # device hits' refreshes, settled by the writer, flush and close
        self._probe = FileProbe()  # the lookups' lstats, off the loop thread and bounded (kv.tier.disk_probe)
        self._queue = WriteQueue(self._changed, self._perform, self.max_pending, self._settle, lambda: bool(self._owed))
        self._names: dict[str, str] = {self.tag: self.fingerprint}  # tag -> fingerprint string
        self._on = True  # False: writing off for good (see `enabled`)
        self._off_reason: str | None = None  # why it turned writing off for good (the first reason)
        self.backoff = WriteBackoff()  # writing paused for a while after a full disk (kv.tier.disk_writer)
        self._unready = False  # True: opened on a full disk, before its folders were made (the writer makes them)
        self._readable = True  # False: a directory that is not ours (never listed or read)
        self._unlinking = self._deletions = 0  # evicted pages whose files are being deleted; a count of such events
        self._count = dict.fromkeys(_COUNTERS, 0)
        # Writes `put` accepted that became no file (in `dropped_writes` too): the write failed (the store is then
        # off), the run's page before it was gone, or a close or a clear discarded it. The tiers' disk_dropped_pages.
        self.lost_writes = 0

        if create:
            adoption = self.layout.adopt(self.fingerprint)
            if adoption.full:  # a marked directory on a full disk: written once space is freed
                self._unready = True
                self._pause(adoption.refused)  # type: ignore[arg-type]  # (a reason with `full`)
            elif adoption.refused is not None:
                self._disable(adoption.refused)
            self._readable = adoption.readable
            if adoption.readable:
                found = self._scan()  # a read-only cache still serves its pages
                warn_if_foreign(self.directory, self.fingerprint, found, self._names)  # only other models' pages?
            if self.enabled:  # a restart with a smaller max_bytes: the limit holds from the start, not after a write
                with self._lock:
                    victims = self._evict_over()
                self._delete(victims)
        else:  # an inspecting handle: the directory must be a cache of this format; nothing is written
            if not os.path.isdir(self.directory):
                raise ValueError(f"{self.directory} does not exist or is not a directory")
            self.layout.check_marker(strict=True)
            self._on = False
            self._scan()

    def _scan(self) -> set[str]:
        """Build the index from names and stat, least recently used (oldest mtime) first; the tags found."""
        found = scan_pages(self.layout)
        with self._lock:
            future = clamp_future(found, self._owed.now())  # mtimes past the clock: now, in their order
        if self.enabled:  # an inspecting handle writes nothing
            set_mtimes(future)
        for tag in {entry.tag for _, entry, _ in found}:
            self._fingerprint_name(tag)
        with self._lock:
            for page_hash, entry, mtime_ns in found:
                # One hash under two fingerprint strings (the same model named twice): the newer file wins; the
                # other stays on disk, outside the index (verify still checks it, clear still deletes it).
                self._index.replace(page_hash, entry, mtime_ns)
        return {entry.tag for _, entry, _ in found}

    def _fingerprint_name(self, tag: str) -> str:
        """The fingerprint string of a tag. Reads a file the first time: call it without the lock."""
        name = self._names.get(tag)
        if name is None:
            name = self._names[tag] = self.layout.fingerprint_of(tag)
        return name

    @property
    def enabled(self) -> bool:
        """Whether the store accepts writes: not turned off, and not pausing after a full disk (`backoff`)."""
        return self._on and not self.backoff.paused()

    @property
    def disabled_reason(self) -> str | None:
        """Why the store accepts no writes (turned off: the first reason; else a full disk's pause); None while on."""
        return (
            self._off_reason if self._off_reason is not None else self.backoff.reason if self.backoff.paused() else None
        )

    def _disable(self, reason: str) -> None:
        """Stop accepting writes for good; warn once. Caller does not hold the lock."""
        with self._lock:
            self._on = False
            first = self._off_reason is None
            if first:
                self._off_reason = reason
        if first:
            log.warning("disk KV cache disabled: %s", reason)

    def _pause(self, reason: str) -> None:
        """A write found the disk full: stop accepting writes for a while (kv.tier.disk_writer's WriteBackoff); warn.
        Caller does not hold the lock."""
        with self._lock:
            wait_s = self.backoff.failed(reason)
        log.warning(
            "disk KV cache: the disk is full; writing paused for %.0f s (pages on disk still served): %s",
            wait_s,
            reason,
        )

    # --------------------------------------------------------------------------------------------- writes

    def put(
        self,
        page_hash: bytes,
        tokens: Sequence[int],
        payload: bytes,
        meta: dict,
        *,
        encoded: PageWrite | None = None,
        parent: bytes | None = None,
    ) -> bool:
        """Queue an asynchronous write of a page; never blocks on I/O.

        Returns False, counting a dropped write, when the store is disabled or closed, when the page is already
        stored or queued, when `max_pending` writes are queued, or when the page alone exceeds `max_bytes`.
        Serializes the header here, so a hash that is not 1-64 bytes, token ids outside int64 or a meta that is
        not JSON-able raise ValueError / TypeError at once. A write that later fails disables the store.
        `encoded`: the page already serialized (`encode_page` of these arguments and this store's fingerprint, as
        kv.tier.disk_queue does to budget the size limit), queued as it is; ValueError for another page's.
        `parent`: the hash of the page before it in its run (None: the page starts a run, or stands alone). The page
        is then stamped just older than its parent, as it is written (`PageIndex.place`), and not written at all (a
        dropped write) when its parent is not held by then: it would never be read.
        """
        if encoded is None:
            write = encode_page(page_hash, self.fingerprint, tokens, payload, meta)
        elif encoded.page_hash != page_hash:
            raise ValueError(f"the encoded page is {encoded.page_hash.hex()}, not {page_hash.hex()}")
        else:
            write = encoded
        key, queue = write.page_hash, self._queue
        with self._lock:
            refused = queue.closed or not self.enabled or key in self._index or key in queue or queue.full
            if refused or write.size > self.max_bytes:
                self._count["dropped_writes"] += 1
                return False
            queue.offer(write._replace(used_ns=self._owed.now(), parent=parent))
        return True

    def _perform(self, key: bytes, write: PageWrite) -> None:
        """The writer thread's work for one queued page: the file, its index entry, the evictions it forces. A page
        whose parent's file is gone (one lstat) is not written, and the parent leaves the index: a run is found from
        its head, and a `cache clear` beside a live engine left its index listing pages no longer there."""
        self._settle()  # the refreshes before it was queued, then the page, then those after
        with self._lock:
            enabled = self.enabled
            assert write.used_ns is not None  # set by `put`
            stamp = self._index.place(write.parent, write.used_ns)
            parent = self._index.get(write.parent) if write.parent is not None and stamp is not None else None
        if parent is not None and not os.path.lexists(parent.path):  # deleted behind our back: a `cache clear`
            with self._lock:
                self._index.drop(write.parent, parent)  # type: ignore[arg-type]  # (not None with an entry)
            stamp = None  # past a gap: never read
        entry: PageEntry | None = None
        if enabled and stamp is not None:
            try:
                entry = self._write_making_room(write._replace(used_ns=stamp))
            except PagePathTaken as exc:  # this page's own path: the others still go to disk
                log.warning("disk KV cache: cannot write a page: %s", exc)
            except PageWriteLost as exc:  # a clear took it: dropped, as the clear drops the queued ones
                log.info("disk KV cache: a page was not written: %s", exc)
            except OSError as exc:
                if exc.errno in FULL_ERRNOS:  # space may be freed: tried again after a while
                    self._pause(f"writing a page failed: {exc}")
                else:
                    self._disable(f"writing a page failed: {exc}")
            except Exception:  # a bug must not kill the writer and leave flush() waiting forever
                log.exception("disk KV cache: unexpected error writing a page")
        victims: list[PageEntry] = []
        with self._lock:
            if entry is None:
                self._count["dropped_writes"] += 1
                self.lost_writes += 1
            elif stamp is not None:  # (always, with an entry)
                self._index.replace(key, entry, stamp)  # an older entry: read after a clear, say (file replaced)
                self._count["writes"] += 1
            resumed = entry is not None and self.backoff.succeeded()
        if resumed:
            log.warning("disk KV cache: writing again after a full disk")
        self._settle()  # the evictions it forces see the refreshes recorded since it was queued
        with self._lock:
            if entry is not None:
                victims = self._evict_over()
        self._delete(victims)

    def _write_making_room(self, write: PageWrite) -> PageEntry:
        """Write one page file (its folders first after an open on a full disk). On a full disk, delete the least
        recently used pages, ROOM_PAGES times this page's size (the size limit's order: the tier keeps working in
        the space the disk has, as it does under `max_bytes`), and try once more. Raises OSError (a disk still full:
        nothing to delete, or deleting did not help)."""
        for attempt in (0, 1):
            try:
                if self._unready:  # opened on a full disk: its folders and fingerprint.json first
                    self.layout.ensure_page_dirs(self.fingerprint)
                    self._unready = False
                return self._write_page(write)
            except OSError as exc:
                if attempt or exc.errno not in FULL_ERRNOS or isinstance(exc, PagePathTaken):
                    raise
                with self._lock:
                    victims = self._evict_over(self._index.bytes - ROOM_PAGES * write.size)
                if not victims:
                    raise
                self._delete(victims)
                log.info("disk KV cache: the disk is full; deleted %d least recently used pages", len(victims))
        raise AssertionError("unreachable")

    def _evict_over(self, limit: int | None = None) -> list[PageEntry]:
        """Take the least recently used pages out of the index until it is under `limit` (None: max_bytes; the lock
        held); their files are then `_delete`d. Until they are gone, `count_prefix` adds no page it finds on disk (one
        of them?)."""
        victims = self._index.evict_over(self.max_bytes if limit is None else max(0, limit))
        if victims:
            self._count["evicted_pages"] += len(victims)
            self._unlinking += len(victims)
            self._deletions += 1
        return victims

    def _delete(self, victims: list[PageEntry]) -> None:
        """Delete the files of pages `_evict_over` took out of the index (without the lock)."""
        for victim in victims:
            try:
                os.unlink(victim.path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                with self._lock:
                    self._index.left_out.add(victim.path)
                self._disable(f"cannot delete {victim.path} to stay under max_bytes: {exc}")
        if victims:
            with self._lock:
                self._unlinking -= len(victims)
                self._deletions += 1

    def _write_page(self, write: PageWrite) -> PageEntry:
        """Write one page file (tests replace this to stall the writer). Raises OSError."""
        return write_page_file(self.layout, write, self.fingerprint)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done, then settle the refreshes: True, or False once `timeout` seconds
        passed (a settle still running then goes on without the caller: `_settle_within`)."""
        timeout = wait_bound(timeout)  # ValueError before anything is done
        ends = None if timeout is None else time.monotonic() + timeout
        flushed = self._queue.flush(timeout)
        return self._settle_within(ends) and flushed

    def close(self, timeout: float | None = None) -> bool:
        """Flush (up to `timeout`), then stop the writer; later puts are dropped. Writes still queued after the
        timeout are discarded. Returns whether the flush (and its settle) completed. Idempotent."""
        timeout = wait_bound(timeout)  # ValueError before anything is done
        ends = None if timeout is None else time.monotonic() + timeout
        flushed, discarded = self._queue.close(timeout)
        flushed = self._settle_within(ends) and flushed
        with self._lock:
            self._count["dropped_writes"] += discarded
            self.lost_writes += discarded
        return flushed

    def _settle_within(self, ends: float | None) -> bool:
        """Settle the owed refreshes by `ends` (time.monotonic; None: no bound): on a helper daemon thread when bounded,
        so that a file system that stalls (a utime that never returns, here or on the writer thread holding the
        settle) holds neither a flush nor a close past its timeout; the settle goes on without the caller. Whether
        it finished."""
        if ends is None:
            self._settle()
            return True
        if not self._owed and not self._owed.busy:
            return True
        helper = threading.Thread(target=self._settle, name="radixcache-disk-settle", daemon=True)
        helper.start()
        helper.join(max(0.0, ends - time.monotonic()))
        if helper.is_alive():
            log.warning("disk KV cache: refreshing page mtimes is still blocked (a stalled disk?); not waited for")
        return not helper.is_alive()

    def __enter__(self) -> DiskStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DiskStore({self.directory!r}, max_bytes={self.max_bytes}, enabled={self.enabled})"
