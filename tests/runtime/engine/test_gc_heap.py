"""runtime.engine.gc_heap: an engine freezes the heap at its first idle moment once it has run FREEZE_AFTER_S (a
short-lived one never does), collecting first, so the garbage it finds is freed rather than frozen; the heap is
unfrozen when the last holder closes; a cycle frozen with an engine that closes is freed by the next full
collection after it closes (not kept frozen for as long as another engine runs), which then freezes the heap again;
`freeze_gc=False` leaves the collector alone; a release without a hold changes nothing."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine import gc_heap
from radixcache.runtime.engine.gc_heap import FROZEN_HEAP, FrozenHeap, HeapTimer
from radixcache.runtime.testing import tiny_model


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """These tests start with nothing frozen (no engine running in this process) and leave nothing frozen."""
    if FROZEN_HEAP.holders:
        pytest.skip("an engine of another test is running in this process")
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_last_release_unfreezes_and_the_frozen_garbage_is_then_collected(unfrozen: None) -> None:
    heap = FrozenHeap()
    node = Node()
    ref = weakref.ref(node)
    heap.hold()
    assert gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert ref() is not None  # frozen: the collector does not see it
    heap.release()
    assert heap.holders == 0 and gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None


def test_a_closing_holder_frees_its_cycles_while_another_holds(unfrozen: None) -> None:
    heap = FrozenHeap()
    heap.hold()  # the engine that keeps running
    node = Node()  # made by the engine that will close
    ref = weakref.ref(node)
    heap.hold()  # that engine starts: its objects are frozen
    del node  # it closes: its cycle is garbage
    gc.collect()
    assert ref() is not None
    heap.release()  # one holder left: unfrozen until the next full collection
    assert heap.holders == 1 and gc.get_freeze_count() == 0 and heap.refreeze_pending
    gc.collect(1)  # a younger generation's collection frees nothing of it and freezes nothing
    assert ref() is not None and gc.get_freeze_count() == 0
    gc.collect()  # the next full one frees the cycle, then the heap is frozen again for the holder left
    assert ref() is None
    assert gc.get_freeze_count() > 0 and not heap.refreeze_pending
    heap.release()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert gc.get_freeze_count() == 0  # nobody holds: a full collection freezes nothing


def test_a_release_without_a_hold_changes_nothing(unfrozen: None) -> None:
    heap = FrozenHeap()
    heap.release()
    assert heap.holders == 0 and gc.get_freeze_count() == 0


def test_a_hold_frees_the_garbage_it_finds_instead_of_freezing_it(unfrozen: None) -> None:
    heap = FrozenHeap()
    node = Node()
    ref = weakref.ref(node)
    del node  # garbage, in a cycle, not collected yet
    heap.hold()
    assert ref() is None
    heap.release()


def test_the_timer_holds_once_at_the_first_idle_moment_past_its_delay(unfrozen: None) -> None:
    heap = FrozenHeap()
    timer = HeapTimer(True, after_s=60.0, heap=heap)
    timer.idle()
    assert heap.holders == 0  # too young
    now = HeapTimer(True, after_s=0.0, heap=heap)
    now.idle()
    now.idle()
    assert heap.holders == 1 and now.hold is not None
    now.close()
    now.close()
    now.idle()  # after close: never again
    assert heap.holders == 0 and gc.get_freeze_count() == 0
    off = HeapTimer(False, after_s=0.0, heap=heap)
    off.idle()
    off.close()
    assert heap.holders == 0


def test_the_collection_waits_for_a_quiet_loop_and_work_puts_it_off(unfrozen: None) -> None:
    """The freeze's collection holds the GIL: it runs only once the loop has stayed idle `quiet_s`, never right
    as the next request arrives (work meanwhile: the next idle moment starts the wait again)."""
    heap = FrozenHeap()
    busy = threading.Event()
    timer = HeapTimer(True, after_s=0.0, heap=heap, quiet_s=0.05, is_idle=lambda: not busy.is_set())
    busy.set()
    timer.idle()  # out of work; then a request arrives within the quiet time
    time.sleep(0.3)
    assert heap.holders == 0 and timer.hold is None
    busy.clear()
    timer.idle()  # idle again, and stays so
    deadline = time.monotonic() + 30
    while timer.hold is None and time.monotonic() < deadline:  # set once the hold (collect, freeze) returned
        time.sleep(0.01)
    assert heap.holders == 1 and timer.hold is not None
    timer.idle()
    time.sleep(0.1)
    assert heap.holders == 1  # once only
    timer.close()
    assert heap.holders == 0
    closed = HeapTimer(True, after_s=0.0, heap=heap, quiet_s=0.05, is_idle=lambda: True)
    closed.idle()
    closed.close()  # before the quiet time is over: the wait is cancelled, nothing is held
    time.sleep(0.2)
    assert heap.holders == 0 and closed.hold is None and gc.get_freeze_count() == 0


def test_an_engine_holds_the_heap_frozen_once_it_has_run_a_while(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gc_heap, "FREEZE_AFTER_S", 0.0)  # its first idle moment is late enough
    with Engine(tiny_model(), capacity_blocks=16, page_size=4, threads=1) as engine:
        assert engine.generate([1, 2, 3], 2).token_ids
        assert engine.wait_idle(10)  # the loop thread ran its idle hook, then exited
        deadline = time.monotonic() + 30  # the hold comes QUIET_S later, on a timer thread
        while engine._heap.hold is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert FROZEN_HEAP.holders == 1 and gc.get_freeze_count() > 0
        assert engine.generate([1, 2, 3], 2).token_ids  # serves as before; idle again: still one hold
        assert engine.wait_idle(10) and FROZEN_HEAP.holders == 1
        engine.close()
        engine.close()  # twice: released once
    assert FROZEN_HEAP.holders == 0 and gc.get_freeze_count() == 0
    with Engine(tiny_model(), capacity_blocks=16, page_size=4, threads=1, freeze_gc=False) as engine:
        assert engine.generate([1, 2, 3], 2).token_ids and engine.wait_idle(10)
        assert FROZEN_HEAP.holders == 0 and gc.get_freeze_count() == 0


def test_a_short_lived_engine_never_freezes(unfrozen: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gc_heap, "FREEZE_AFTER_S", 60.0)  # however slow this machine is today
    with Engine(tiny_model(), capacity_blocks=16, page_size=4, threads=1) as engine:
        assert engine.generate([1, 2, 3], 2).token_ids and engine.wait_idle(10)
        assert FROZEN_HEAP.holders == 0  # its first idle moment came well before FREEZE_AFTER_S


def test_an_engine_dropped_without_close_lets_go_of_the_heap_and_its_pool_is_freed(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: only close() released the hold. An engine dropped without it (a notebook's, a script's that
    builds another) left the heap frozen for good, with its scheduler and KV pool inside: their cycles (the loop and
    its idle hook) were never collected, whatever the process did next."""
    monkeypatch.setattr(gc_heap, "FREEZE_AFTER_S", 0.0)
    engine = Engine(tiny_model(), capacity_blocks=16, page_size=4, threads=1)
    assert engine.generate([1, 2, 3], 2).token_ids and engine.wait_idle(10)
    deadline = time.monotonic() + 30  # the hold comes QUIET_S later, on a timer thread
    while engine._heap.hold is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert FROZEN_HEAP.holders == 1
    pool = weakref.ref(engine.pool)
    del engine  # freed at once by reference counting (test_engine_freed): no collection needed, frozen or not
    assert FROZEN_HEAP.holders == 0 and gc.get_freeze_count() == 0
    assert pool() is None


class CollectingHeap:
    """A heap whose first hold's collection runs a finalizer that closes another engine's timer (a dropped engine's
    `weakref.finalize`), once a second hold waits for the heap's lock."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.holders = 0
        self.finalizer: Callable[[], None] | None = None
        self.collecting = threading.Event()
        self.second_waits = threading.Event()

    def hold(self) -> gc_heap.HeapHold:
        if self.finalizer is None:
            self.second_waits.set()
        with self._lock:
            self.holders += 1
            finalizer, self.finalizer = self.finalizer, None
            if finalizer is not None:
                self.collecting.set()
                assert self.second_waits.wait(10)
                time.sleep(0.1)  # the second hold is now blocked on the heap's lock
                finalizer()
        return gc_heap.HeapHold(self)  # type: ignore[arg-type]

    def release(self) -> None:
        with self._lock:
            self.holders -= 1


def test_a_finalizer_closing_a_timer_that_waits_for_the_heap_does_not_deadlock() -> None:
    """Regression: a timer held its own lock while it waited for the heap; the collection of another engine's hold,
    holding the heap, ran a dropped engine's finalizer, which closed that timer: each waited for the other's lock,
    and the first engine's loop thread then hung at its next idle moment."""
    heap = CollectingHeap()
    waiting = HeapTimer(True, after_s=0.0, heap=heap, quiet_s=0.05, is_idle=lambda: True)  # the dropped engine's
    collecting = HeapTimer(True, after_s=0.0, heap=heap, quiet_s=0.0)
    heap.finalizer = waiting.close
    first = threading.Thread(target=collecting.idle, daemon=True)
    first.start()
    assert heap.collecting.wait(10)
    waiting.idle()  # its timer fires and waits for the heap while the collection runs
    first.join(10)
    assert not first.is_alive(), "deadlocked"
    collecting.close()
    deadline = time.monotonic() + 10
    while heap.holders and time.monotonic() < deadline:  # the closed timer's late hold is released at once
        time.sleep(0.01)
    assert heap.holders == 0 and waiting.hold is None


def test_a_timer_closed_by_a_finalizer_on_its_own_thread_does_not_deadlock() -> None:
    """A collection can run on any allocation: under the timer's lock (its idle check), it may run the finalizer of
    the timer's own engine, dropped in a cycle of its caller's, which closes the timer on that same thread."""
    heap = CollectingHeap()
    checked = threading.Event()

    def is_idle_then_finalized() -> bool:
        timer.close()  # what the finalizer does
        checked.set()
        return True

    timer = HeapTimer(True, after_s=0.0, heap=heap, quiet_s=0.01, is_idle=is_idle_then_finalized)
    timer.idle()
    assert checked.wait(10), "deadlocked"
    time.sleep(0.05)
    assert heap.holders == 0 and timer.hold is None  # closed: it never holds
