"""The disk store's looks at the file system on behalf of the engine loop (kv.tier.disk_lookups' `count_prefix` and
`forget_missing`: an `lstat` a page), run on a thread of their own and waited for a bounded time, so that a stuck
file system (a network mount that stopped answering) never holds the loop: a look not answered within `wait_s` is
given up (the caller goes on with what its index says: a page another process wrote is not found, a vanished one is
still listed), and while that look is still stuck no other starts, and none is waited for. A page found absent is
not looked for again for ABSENT_S (a waiting request asks at each step); another process's write of it is found
after that.

Invariants: one look at a time (a second caller waits its turn within the bound); the thread is a daemon, started at a
look and exiting after `IDLE_EXIT_S` without one, so a store dropped without `close` holds no thread; a look's exception
is the caller's (raised there), and a look given up is dropped when it ends (its answer is stale by then).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

WAIT_S = 0.1  # the longest the caller waits for a look (an lstat takes microseconds on a sound disk)
IDLE_EXIT_S = 1.0  # the thread exits after this long without a look
ABSENT_S = 0.5  # a page a look found absent is not looked for again for this long (a waiting request, each step)
MAX_ABSENT = 4096  # the most pages remembered absent (past it, forgotten all at once)
_clock = time.monotonic  # (a test's clock replaces it)


class _Look(Generic[T]):
    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn, self.done = fn, threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None


class FileProbe:
    """Runs one look at a time on its daemon thread; `look` waits for it at most `wait_s`."""

    def __init__(self, wait_s: float = WAIT_S) -> None:
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._next: _Look | None = None  # handed to the thread, not yet taken
        self._busy = False  # a look handed over and not finished (perhaps stuck)
        self._since = 0.0  # when that look was handed over (time.monotonic)
        self._thread: threading.Thread | None = None
        self.given_up = 0  # looks not answered within wait_s
        self._absent: dict[bytes, float] = {}  # page hash -> when a look found it absent (time.monotonic)

    def absent(self, page_hash: bytes) -> bool:
        """Whether a look found the page absent less than ABSENT_S ago (then it is not looked for again: a request
        waiting for admission asks at each step)."""
        seen = self._absent.get(page_hash)
        return seen is not None and _clock() - seen < ABSENT_S

    def note_absent(self, page_hash: bytes) -> None:
        if len(self._absent) >= MAX_ABSENT:
            self._absent.clear()
        self._absent[page_hash] = _clock()

    def look(self, fn: Callable[[], T]) -> tuple[bool, T | None]:
        """(True, fn()) run on the probe's thread, or (False, None) when it did not answer within `wait_s` or a look
        before it is still running (stuck). Raises what `fn` raised."""
        item = _Look(fn)
        with self._cond:
            # Another caller's look, still within its bound: this one waits its turn (at most that bound); one past
            # it is stuck, and is not waited for again.
            if self._busy and _clock() - self._since < self.wait_s:
                self._cond.wait_for(lambda: not self._busy, self.wait_s)
            if self._busy:
                return False, None
            self._busy, self._next, self._since = True, item, _clock()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="radixcache-disk-probe", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        if not item.done.wait(self.wait_s):
            with self._cond:
                self.given_up += 1
            return False, None
        if item.error is not None:
            raise item.error
        return True, item.result

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._next is not None, IDLE_EXIT_S):
                    self._thread = None  # under the lock: the next look starts another
                    return
                item, self._next = self._next, None
            try:
                item.result = item.fn()
            except BaseException as exc:  # the caller's to raise
                item.error = exc
            with self._cond:
                self._busy = False
                self._cond.notify_all()  # a caller waiting its turn
            item.done.set()
