"""The refreshes the disk store owes to pages used elsewhere (kv.tier.disk_store: `refresh`, a device hit).

The index is rebuilt by mtime at open, so a page used only on the device must get a newer mtime too, or a run every
request hits on the device looks the oldest on disk after a restart and a smaller size limit deletes it first. A
refresh comes from the engine's loop thread, which must neither wait for the disk nor hash a prompt the device holds
whole: it records the run (its hashes, or a function computing them) and the time here, and `settle` (the writer
thread around each write and within SETTLE_S without writes, `flush`, `close`) hashes, moves the pages in the index
and sets their mtimes. A page written that starts a run is stamped with the time it was queued (`now`): the writer's
lag must not make it look newer than a hit that came after it; a later page of a run, just older than the page before
it (kv.tier.disk_index `place`).

Invariants: a run is stamped falling from its first page, 1 us a page (a file system keeping microseconds tells them
apart), the head newest, in the index and by mtime alike (the index orders pages by these stamps); each run's stamps
are newer than those of the runs settled before it, and older than every `now` after it; runs and writes reach the
index in the order they were recorded and queued (a write's evictions see the refreshes recorded before it); at most
`MAX_RUNS` runs of at most `MAX_PAGES` pages in all wait (but one run of any size), the least recent dropped first; a
stamp is set only on the file the index holds as it settles. A process killed before settling (within SETTLE_S of the
record, kv.tier.disk_writer) loses its runs' stamps (not its pages).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from radixcache.runtime.kv.tier.disk_index import STEP_NS, PageEntry, PageIndex

MAX_RUNS = 4096  # refreshes waiting to be settled, and their pages (bounds on memory while nothing is written)
MAX_PAGES = 65536
log = logging.getLogger("radixcache.disk")
_NOFOLLOW = os.utime not in os.supports_follow_symlinks  # False where supported: no symlink is followed


class LaterHashes(Protocol):
    """A run's hashes, computed when called (radixcache.page_hash.DeferredHashes); `len` is how many."""

    def __len__(self) -> int: ...

    def __call__(self) -> Sequence[bytes]: ...


Hashes = Sequence[bytes] | LaterHashes


class OwedRefreshes:
    """The runs refreshed and not yet settled, oldest first. The store's lock guards `now`, `record`, `take` and
    `apply`; `settle` takes it as needed."""

    def __init__(self, max_runs: int = MAX_RUNS, max_pages: int = MAX_PAGES) -> None:
        self.max_runs, self.max_pages = max_runs, max_pages
        self._runs: deque[tuple[int, Hashes]] = deque()
        self._pages = 0  # in the runs waiting
        self._last_ns = self._clock_ns = 0
        self._settling = threading.Lock()

    def __len__(self) -> int:
        return len(self._runs)

    @property
    def busy(self) -> bool:
        """Whether a settle is running (runs taken, perhaps not stamped yet)."""
        return self._settling.locked()

    def now(self) -> int:
        """The time in ns, later than every `now` before it (a queued write's mtime, a refresh's)."""
        self._clock_ns = max(time.time_ns(), self._clock_ns + 1)
        return self._clock_ns

    def record(self, hashes: Hashes) -> None:
        """A run (head first) used now: its hashes, or a function that computes them (called when settling)."""
        self._runs.append((self.now(), hashes))
        self._pages += len(hashes)
        while len(self._runs) > self.max_runs or (self._pages > self.max_pages and len(self._runs) > 1):
            self._pages -= len(self._runs.popleft()[1])

    def take(self, upto_ns: int | None = None) -> list[tuple[int, Hashes]]:
        """The runs recorded (before `upto_ns`), oldest first; they are no longer owed."""
        runs = []
        while self._runs and (upto_ns is None or self._runs[0][0] < upto_ns):
            runs.append(self._runs.popleft())
            self._pages -= len(runs[-1][1])
        return runs

    def settle(self, index: PageIndex, lock: threading.Lock, upto: Callable[[], int | None]) -> None:
        """Settle the runs recorded before `upto()` (called under `lock`; None: all): hash them, refresh them in
        `index` under `lock` (which guards both and `record`), and set their files' mtimes. Settles are serialized, so
        runs are applied in order; an error is logged, never raised (the writer thread must go on)."""
        with self._settling:
            try:
                with lock:
                    runs = self.take(upto())
                if runs:
                    ready = [(at_ns, hashes() if callable(hashes) else hashes) for at_ns, hashes in runs]  # CPU only
                    with lock:
                        due = self.apply(index, ready)
                    set_mtimes(due)
            except Exception:
                log.exception("disk KV cache: unexpected error refreshing pages")

    def apply(self, index: PageIndex, runs: list[tuple[int, Sequence[bytes]]]) -> list[tuple[str, int]]:
        """Refresh each run in the index, in order, and return the (path, ns) stamps of the pages it holds."""
        due: dict[bytes, tuple[PageEntry, int]] = {}
        for at_ns, hashes in runs:
            held = sum(h in index for h in hashes)
            # newer than every run before it, even within the clock's resolution or after it stepped back
            head_ns = self._last_ns = max(at_ns, self._last_ns + held * STEP_NS)
            self._clock_ns = max(self._clock_ns, head_ns)  # and older than every use after it
            for page_hash, entry, ns in index.refresh(hashes, head_ns):
                due[page_hash] = (entry, ns)
        return [(e.path, ns) for h, (e, ns) in due.items() if index.get(h) is e]


def set_mtimes(due: Sequence[tuple[str, int]]) -> None:
    """Set each file's atime and mtime (ns), skipping one that is gone or cannot be changed. Without the lock."""
    for path, ns in due:
        with contextlib.suppress(OSError):
            os.utime(path, ns=(ns, ns), follow_symlinks=_NOFOLLOW)
