"""The disk store's writing side: one page file written atomically, the background thread that writes the queued
pages one at a time, so that no request ever waits for the disk, and the pause in writing after a full disk
(`WriteBackoff`: tried again after a while, as space may be freed).

Invariants:

- A page file is only ever created complete and durable: it is written under `tmp/`, fsynced, `os.replace`d into
  place, and its folder is fsynced. A failed write removes its temporary file.
- The queue holds at most `max_pending` writes, each page at most once. A write stays counted as pending until
  the thread has finished everything it causes (the file, its index entry, the evictions it forces), so that
  `flush` returning means the store is settled.
- The thread runs only while there is work: it exits after `IDLE_EXIT_S` with nothing queued and nothing owed (the
  next offer or `wake` starts another), so a store (or an Engine) dropped without `close` holds no thread, and no
  store through it, for ever.
- Owed work (`owed()`: device hits' refreshes, kv.tier.disk_stamps) is settled within `SETTLE_S` of the thread's
  start or last wait even with nothing to write, so a process killed later keeps it; the loop thread that records it
  neither waits nor notifies (`wake` only starts a thread when none runs).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Container

from radixcache.runtime.kv.tier.disk_files import is_real_dir, write_durable
from radixcache.runtime.kv.tier.disk_format import MAGIC, PageWrite, page_checksum
from radixcache.runtime.kv.tier.disk_index import PageEntry
from radixcache.runtime.kv.tier.disk_layout import CacheDir

IDLE_EXIT_S = 1.0  # how long the writer thread waits for another write before it exits
SETTLE_S = 0.1  # the longest owed work waits for the thread with nothing written


class PagePathTaken(OSError):
    """A folder sits where one page's file goes: that page cannot be written, but the store can write others."""


class PageWriteLost(OSError):
    """A page's temporary file or folder vanished while it was written, again after the folders were made anew: a
    `cache clear` (which deletes every temporary file) racing the writer. That page is dropped; the store writes on."""


def write_page_file(cache_dir: CacheDir, write: PageWrite, fingerprint: str) -> PageEntry:
    """Write one page file durably: a temporary file, fsync, an atomic rename into place, fsync of its folder (and
    of the fingerprint folder when the page's folder is new). When a folder vanished meanwhile (a `cache clear`, an
    `rm -r` of a folder or of the whole directory), recreate the folders (and the directory with its marker:
    `CacheDir.remake`) once and retry; PageWriteLost when it vanishes again (a clear racing the writer,
    which takes the temporary file too). Raises PagePathTaken when a folder holds the page's name (a
    rename never replaces one; any other entry there is replaced), OSError for other failures (a file renamed into
    place before its folder's fsync failed is removed: it is not in the index)."""
    path = cache_dir.page_path(write.page_hash)
    folder = os.path.dirname(path)
    digest = page_checksum(write.prefix, write.tokens, write.payload)
    for attempt in (0, 1):
        try:
            new_folder = False
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder)
                new_folder = True
            chunks = [MAGIC, digest, write.prefix, write.tokens, write.payload]
            write_durable(
                cache_dir.tmp_dir, path, chunks, sync_parent=new_folder, mtime_ns=write.used_ns, unplace_on_failure=True
            )
            return PageEntry(path, write.size, cache_dir.tag)
        except OSError as exc:
            if is_real_dir(path):
                raise PagePathTaken(exc.errno, "a folder holds the page's name", path) from exc
            if exc.errno != errno.ENOENT:
                raise
            if attempt:
                raise PageWriteLost(exc.errno, "deleted while written (a cache clear?)", path) from exc
            cache_dir.remake(fingerprint)  # the whole directory too, after an `rm -rf` of it
    raise AssertionError("unreachable")


def wait_bound(timeout: float | None) -> float | None:
    """`timeout` seconds as the bound of a wait: None (no bound) for None, infinity, or a bound past what a thread can
    wait (threading.TIMEOUT_MAX, about 292 years: a wait raised OverflowError, and 10**400 failed float()). ValueError
    unless a number >= 0: NaN waited for ever (no time is past it), infinity overflowed the clock, a string failed
    inside."""
    if timeout is None or timeout == math.inf:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout < math.inf:
        raise ValueError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
    return None if timeout >= threading.TIMEOUT_MAX else float(timeout)


class WriteQueue:
    """The writes waiting for the disk, and the one thread that performs them in order of arrival.

    `changed` is the store's condition, whose lock also guards the store's index: `offer`, `discard_queued`,
    `__len__` and `__contains__` are called with it held; `flush` and `close` take it. The thread pops a write
    under the lock, runs `perform(page_hash, write)` without it (the file I/O), then forgets the write and
    notifies. The thread starts at an offer and ends at `close`, or once it has waited `IDLE_EXIT_S` for work.
    """

    def __init__(
        self,
        changed: threading.Condition,
        perform: Callable[[bytes, PageWrite], None],
        max_pending: int,
        settle: Callable[[], None] = lambda: None,
        owed: Callable[[], bool] = lambda: False,
    ) -> None:
        self._changed = changed
        self._perform = perform
        self._settle, self._owed = settle, owed  # owed work: checked under the lock, settled without it
        self.max_pending = max_pending
        self._pending: dict[bytes, PageWrite] = {}  # queued or being written
        self._queue: deque[bytes] = deque()
        self._thread: threading.Thread | None = None
        self.closed = False

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, page_hash: object) -> bool:
        return page_hash in self._pending

    def first_unwritten_ns(self, written: Container[bytes]) -> int | None:
        """When the first write queued or in progress whose page is not yet `written` was queued (None: none)."""
        return next((w.used_ns for h, w in self._pending.items() if h not in written), None)

    @property
    def full(self) -> bool:
        return len(self._pending) >= self.max_pending

    def offer(self, write: PageWrite) -> None:
        """Queue a write (the caller checked `closed`, `full` and duplicates, holding the lock)."""
        self._pending[write.page_hash] = write
        self._queue.append(write.page_hash)
        self._changed.notify_all()
        self.wake()

    def wake(self) -> None:
        """Start the thread unless it runs or the queue is closed (with the lock held): owed work was recorded, to
        be settled within SETTLE_S. No notification: the thread looks at least every SETTLE_S."""
        if self._thread is None and not self.closed:
            self._thread = threading.Thread(target=self._run, name="radixcache-disk-writer", daemon=True)
            self._thread.start()

    def discard_queued(self) -> int:
        """Forget the writes not yet started (one in progress still lands); return how many."""
        for page_hash in self._queue:
            self._pending.pop(page_hash, None)
        discarded = len(self._queue)
        self._queue.clear()
        self._changed.notify_all()
        return discarded

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is done (True), or `timeout` seconds passed (False). ValueError for a
        timeout that is not a number >= 0 or None (`wait_bound`)."""
        timeout = wait_bound(timeout)
        with self._changed:
            return self._changed.wait_for(lambda: not self._pending, timeout)

    def close(self, timeout: float | None = None) -> tuple[bool, int]:
        """Flush (up to `timeout`), discard what is still queued and stop the thread (waiting for it within the
        same `timeout`). Returns whether the flush completed and how many writes were discarded."""
        timeout = wait_bound(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        flushed = self.flush(timeout)
        with self._changed:
            self.closed = True
            discarded = self.discard_queued()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return flushed, discarded

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            with self._changed:
                if not self._queue and not self.closed:
                    self._changed.wait_for(lambda: self._queue or self.closed, SETTLE_S)
                idle = not self._queue and not self._owed() and time.monotonic() - idle_since >= IDLE_EXIT_S
                if self.closed or idle:  # under the lock, so the next offer or wake starts a new thread
                    self._thread = None
                    return
                page_hash = self._queue.popleft() if self._queue else None
                write = self._pending[page_hash] if page_hash is not None else None
            if write is None:  # nothing to write for SETTLE_S: what is owed is settled now
                self._settle()
                continue
            self._perform(page_hash, write)
            idle_since = time.monotonic()
            with self._changed:
                del self._pending[page_hash]  # only now: flush() also waits for what the write caused
                self._changed.notify_all()


RETRY_S = 60.0  # how long writing pauses after a write finds the disk full, the first time
MAX_RETRY_S = 3600.0  # the longest pause: each retry that finds the disk still full doubles it, up to this


class WriteBackoff:
    """Writing paused after a write found the disk full (ENOSPC, EDQUOT: space another process, a log rotation or
    an operator may free): tried again `first_s` later, each try that finds it still full doubling the pause, up to
    `max_s`; a write that succeeds ends it. `clock`: monotonic seconds. The store changes it under its lock."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, first_s: float = RETRY_S, max_s: float = MAX_RETRY_S
    ):
        self.clock, self.first_s, self.max_s = clock, first_s, max_s
        self.until: float | None = None  # when writing is tried again; None: not paused
        self.wait_s = first_s
        self.reason: str | None = None

    def paused(self) -> bool:
        until = self.until
        return until is not None and self.clock() < until

    def failed(self, reason: str) -> float:
        """A write found the disk full: pause writing (a longer pause if it was a retry); the seconds paused."""
        if self.until is not None:
            self.wait_s = min(self.wait_s * 2, self.max_s)
        self.until, self.reason = self.clock() + self.wait_s, reason
        return self.wait_s

    def succeeded(self) -> bool:
        """A write succeeded: whether that ended a pause."""
        if self.until is None:
            return False
        self.until, self.wait_s, self.reason = None, self.first_s, None
        return True
