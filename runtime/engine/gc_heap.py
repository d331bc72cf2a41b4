"""The garbage collector's heap, frozen while engines run (`gc.freeze`), so that a collection walks only the objects
made since.

Why: a full collection holds the GIL, and so the engine loop, for as long as it walks every tracked object: about
100 ms over the 220,000 a process holds once torch, the server and SmolLM2 are loaded (3.11, this project's 2-core
VM). Allocation anywhere in the process triggers one now and then, at no step in particular: in the disk-load
benchmark (scripts/bench_tier_prefetch.py) a decode with nothing else running had single gaps of 51-85 ms against
its 20 ms steps, and the runs' p99 followed those gaps more than anything the benchmark compared. Frozen objects are
never walked: with the heap frozen, no collection during that benchmark took over 1.5 ms, and the decode's p99
alone was 31 and 35 ms in two runs against 73 without.

How (the collector is one per process, so the engines relying on it are counted per process: `FROZEN_HEAP`):
- an engine freezes once it has run a while: the first time its loop has had no work for QUIET_S (0.25 s), at
  least FREEZE_AFTER_S (1 s) after it was built (`HeapTimer.idle` starts the wait, a timer thread checks the loop is
  still idle), it calls `FROZEN_HEAP.hold()`, which unfreezes, collects everything (the garbage of engines closed
  before it is freed here, never frozen again) and freezes what is left. That one collection (25 to 100 ms, the GIL
  held) falls in a pause. At the first idle moment instead, it met the request that came right after the one that
  had just finished: in scripts/bench_tiers.py a host hit waited 24-26 ms for it before its step, in 2 of 4 rounds.
  Engines that live less, most of a test suite's, never pay it;
- a closing engine lets go (`release`): the heap is unfrozen. If others still hold it, the next full collection
  the collector runs by itself (one pause for them, as before freezing) frees the closed engine's cycles, and its
  callback freezes the heap again; an explicit collection at each such close cost the test suite 190 ms each, 97
  times in tests/runtime/engine alone. After the last one the collector's own thresholds take over as before.
`Engine(freeze_gc=False)` leaves the collector alone (a caller that manages it itself).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

FREEZE_AFTER_S = 1.0  # an engine's age before its first idle moment freezes the heap
QUIET_S = 0.25  # how long the loop must have stayed idle for the freeze's collection to run


class HeapHold:
    """One engine's hold on the frozen heap; `release` lets go, once (later calls do nothing)."""

    def __init__(self, heap: FrozenHeap) -> None:
        self._heap: FrozenHeap | None = heap

    def release(self) -> None:
        heap, self._heap = self._heap, None
        if heap is not None:
            heap.release()


class FrozenHeap:
    """How many engines hold the heap frozen (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # reentrant: a finalizer that the collection in `hold` runs may release
        self.holders = 0
        self.refreeze_pending = False  # unfrozen while holders remain: the next full collection freezes again
        self._watching = False

    def hold(self) -> HeapHold:
        with self._lock:
            self.holders += 1
            gc.unfreeze()  # what an engine that closed left: collected with the rest, not frozen again
            gc.collect()
            gc.freeze()
            self.refreeze_pending = False
            if not self._watching:
                gc.callbacks.append(self._after_collection)
                self._watching = True
        return HeapHold(self)

    def release(self) -> None:
        with self._lock:
            if self.holders == 0:
                return  # released more often than held: nothing of ours is frozen
            self.holders -= 1
            gc.unfreeze()
            self.refreeze_pending = self.holders > 0

    def _after_collection(self, phase: str, info: dict) -> None:
        """gc's callback: once a full collection has freed the closed engines' cycles, freeze again for those left.
        Runs on whichever thread the collection ran on, with the GIL: no lock (flags only, then `gc.freeze`)."""
        if phase == "stop" and info.get("generation") == 2 and self.refreeze_pending and self.holders:
            self.refreeze_pending = False
            gc.freeze()


# The collector is process-wide state already; this counts who relies on it, for the whole process.
FROZEN_HEAP = FrozenHeap()


class HeapTimer:
    """One engine's part: once its loop runs out of work (`idle`, on the loop thread) at least `after_s` seconds
    after the engine was built and stays so for `quiet_s` (`is_idle`, checked then on a timer thread; 0: at once,
    on the loop thread), it holds the heap frozen (`FROZEN_HEAP.hold`: a full collection, then the freeze); work
    that came meanwhile puts it off to the next idle moment. `close` lets go. Short-lived engines (most of a test
    suite's) never pay the collection. Thread-safe."""

    def __init__(
        self,
        enabled: bool,
        after_s: float | None = None,
        heap: FrozenHeap = FROZEN_HEAP,
        *,
        quiet_s: float | None = None,
        is_idle: Callable[[], bool] | None = None,
    ) -> None:
        # reentrant: an allocation under it may run a collection, and so the finalizer that closes this very timer
        # (its engine dropped in a cycle of the caller's while its loop or timer thread is here)
        self._lock = threading.RLock()
        wait = FREEZE_AFTER_S if after_s is None else after_s
        self._due: float | None = time.monotonic() + wait if enabled else None
        self._heap = heap
        self.quiet_s = QUIET_S if quiet_s is None else quiet_s
        self.is_idle = is_idle  # the engine sets its loop's `idle` once the loop exists
        self._timer: threading.Timer | None = None
        self._closed = False
        self.hold: HeapHold | None = None

    def idle(self) -> None:
        with self._lock:
            if self._due is None or time.monotonic() < self._due or self._timer is not None:
                return
            if self.quiet_s <= 0 or self.is_idle is None:
                self._due = None
            else:
                self._timer = threading.Timer(self.quiet_s, self._after_quiet)
                self._timer.daemon = True
                self._timer.start()
                return
        self._take_hold()

    def close(self) -> None:
        with self._lock:
            self._due = None  # never again
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self.hold is not None:
                self.hold.release()

    def _after_quiet(self) -> None:
        with self._lock:
            self._timer = None
            is_idle = self.is_idle
            if self._due is None or (is_idle is not None and not is_idle()):
                return  # closed, or work came: the loop's next idle moment starts the wait again
            self._due = None
        self._take_hold()

    def _take_hold(self) -> None:
        """Hold the heap, outside this timer's lock: the hold's collection runs finalizers, one of which may close
        another engine's timer while that timer's own thread waits for the heap, its lock held (a deadlock of the
        two). A close that came meanwhile releases the hold at once."""
        hold = self._heap.hold()
        with self._lock:
            closed = self._closed
            if not closed:
                self.hold = hold
        if closed:
            hold.release()
