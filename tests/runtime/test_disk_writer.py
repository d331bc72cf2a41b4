"""The disk tier's background writer (radixcache.runtime.kv.tier.disk_writer): a bounded queue and a `put` that never
blocks, `close` and the context manager, and write failures that disable the store without raising.
"""

from __future__ import annotations

import gc
import math
import threading
import time
import weakref
from pathlib import Path

import pytest

from radixcache.runtime.kv.tier import disk_writer
from radixcache.runtime.kv.tier.disk_store import DiskStore
from tests.runtime.conftest import FP, META, disk_warnings, h, page_path, payload, toks, write
from tests.runtime.disk_split import read_whole as read
from tests.runtime.tier_faults.fs_faults import deny_writes


def _stall(store: DiskStore) -> tuple[threading.Event, threading.Event]:
    """Make the writer block before each write until `gate` is set; `started` is set when it first blocks."""
    gate, started = threading.Event(), threading.Event()
    real = store._write_page

    def slow(write):
        started.set()
        assert gate.wait(30)
        return real(write)

    store._write_page = slow  # type: ignore[method-assign]
    return gate, started


def test_put_never_blocks_and_drops_beyond_max_pending(open_store) -> None:
    store = open_store(max_pending=4)
    gate, started = _stall(store)
    assert store.put(h(0), toks(0), payload(0), META)
    assert started.wait(10)  # the writer holds page 0
    t0 = time.perf_counter()
    accepted = [store.put(h(i), toks(i), payload(i), META) for i in range(1, 6)]
    elapsed = time.perf_counter() - t0
    assert accepted == [True, True, True, False, False]
    # A put that waited for the stalled writer would take the stall's 30 s (the gate opens only below): a bound
    # far under that and far over any busy machine's scheduling delay.
    assert elapsed < 10, f"put blocked for {elapsed:.3f}s"
    assert not store.put(h(1), toks(1), payload(1), META)  # already queued
    assert store.flush(timeout=0.05) is False
    assert store.stats().pending_writes == 4
    gate.set()
    assert store.flush(timeout=10)
    s = store.stats()
    assert (s.pages, s.writes, s.dropped_writes, s.pending_writes) == (4, 4, 3, 0)
    assert not store.put(h(1), toks(1), payload(1), META)  # already stored


def test_a_flush_or_close_timeout_that_is_no_number_of_seconds_is_refused(open_store) -> None:
    """NaN waited for ever (no time is past it), infinity overflowed the clock, a string failed inside."""
    store = open_store()
    release, entered = _stall(store)
    assert store.put(h(0), toks(0), payload(0), META) and entered.wait(10)
    for bad in (math.nan, -1, "5", True):
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0 or None"):
            store.flush(bad)
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0 or None"):
            store.close(bad)
    threading.Timer(0.2, release.set).start()
    assert store.flush(math.inf)  # no bound
    assert store.close(math.inf) and store.stats().writes == 1


@pytest.mark.parametrize("huge", [1e10, 10**400])
def test_a_bound_past_what_a_thread_can_wait_is_no_bound(open_store, huge: float) -> None:
    """A finite bound past threading.TIMEOUT_MAX (about 292 years) raised OverflowError from the wait ('timestamp out
    of range'), 10**400 from float(): Engine.close(1e10) stopped half way (and the process aborted at exit), a
    RequestHandle's result(1e10) failed a request that was running fine. They wait as infinity does."""
    assert disk_writer.wait_bound(huge) is None
    store = open_store()
    release, entered = _stall(store)
    assert store.put(h(0), toks(0), payload(0), META) and entered.wait(10)
    threading.Timer(0.2, release.set).start()
    assert store.flush(huge)
    assert store.close(huge) and store.stats().writes == 1


def test_max_pending_zero_drops_every_write(open_store) -> None:
    store = open_store(max_pending=0)
    assert not store.put(h(0), toks(0), payload(0), META)
    assert store.flush(timeout=1) and store.stats().dropped_writes == 1


def test_close_discards_what_it_could_not_flush_and_later_puts_drop(open_store) -> None:
    store = open_store()
    gate, started = _stall(store)
    for i in range(3):
        assert store.put(h(i), toks(i), payload(i), META)
    assert started.wait(10)
    threading.Timer(0.3, gate.set).start()
    assert store.close(timeout=0.05) is False
    assert not store.put(h(9), toks(9), payload(9), META)
    assert store.close(timeout=10)  # idempotent
    assert store.stats().pending_writes == 0


def test_the_context_manager_flushes_and_closes(tmp_path: Path) -> None:
    with DiskStore(tmp_path / "c", max_bytes=1 << 20) as store:
        write(store, 0)
        assert store.put(h(1), toks(1), payload(1), META)
    assert not store.put(h(2), toks(2), payload(2), META)
    assert DiskStore(tmp_path / "c", max_bytes=1 << 20).count_prefix([h(0), h(1)]) == 2


def test_a_failing_write_disables_the_store_without_raising(open_store, caplog) -> None:
    """A real filesystem error: the page's folder name is taken by a file, so creating it fails (even as root)."""
    store = open_store()
    ok_hash, bad = b"\x01" * 16, [b"\xab" + bytes([i]) * 15 for i in range(3)]
    assert store.put(ok_hash, toks(0), payload(0), META) and store.flush(10)
    blocker = Path(store.pages_dir) / "ab"
    blocker.write_text("not a folder")
    assert store.put(bad[0], toks(1), payload(1), META)
    assert store.put(bad[1], toks(2), payload(2), META)
    assert store.flush(10)
    assert not store.enabled
    assert not store.put(bad[2], toks(3), payload(3), META)
    s = store.stats()
    assert (s.pages, s.writes, s.dropped_writes) == (1, 1, 3)
    assert len(disk_warnings(caplog)) == 1 and "disabled" in disk_warnings(caplog)[0].getMessage()
    assert list(Path(store.tmp_dir).iterdir()) == []  # the failed write's temporary file is gone
    assert store.read(ok_hash, toks(0)) == (payload(0), META)  # what is on disk is still served


def test_a_folder_at_one_pages_path_drops_that_write_alone(open_store, caplog) -> None:
    """A folder named as a page file made the rename fail, and that one page disabled every write of the process."""
    store = open_store()
    taken = page_path(store, h(1))
    (taken / "inside").mkdir(parents=True)
    for i in (0, 1, 2):
        assert store.put(h(i), toks(i), payload(i), META)
    assert store.flush(10)
    assert store.enabled
    assert store.put(h(3), toks(3), payload(3), META) and store.flush(10)
    s = store.stats()
    assert (s.pages, s.writes, s.dropped_writes) == (3, 3, 1)
    assert store.count_prefix([h(0)]) == 1 and store.count_prefix([h(1)]) == 0
    assert [read(store, h(i), toks(i)) for i in (0, 2, 3)] == [(payload(i), META) for i in (0, 2, 3)]
    assert taken.is_dir() and list(Path(store.tmp_dir).iterdir()) == []
    assert ["a folder holds the page's name" in r.getMessage() for r in disk_warnings(caplog)] == [True]


def test_a_read_only_pages_folder_disables_the_store_without_raising(open_store, caplog, monkeypatch) -> None:
    store = open_store()
    deny_writes(monkeypatch, store.pages_dir)  # simulated: file modes do not stop root
    assert store.put(h(0), toks(0), payload(0), META)
    assert store.flush(10)
    assert not store.enabled
    assert not store.put(h(1), toks(1), payload(1), META)
    assert len(disk_warnings(caplog)) == 1
    assert list(Path(store.tmp_dir).iterdir()) == []


def _writers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "radixcache-disk-writer"]


def test_an_idle_writer_exits_and_a_dropped_store_holds_no_thread(tmp_path: Path, monkeypatch) -> None:
    """A store dropped without close (an Engine with a cache directory that was never closed) kept its writer
    thread, waiting for writes, and through it the store, for the life of the process: one more per engine."""
    monkeypatch.setattr(disk_writer, "IDLE_EXIT_S", 0.05, raising=False)
    before = set(_writers())
    store = DiskStore(tmp_path / "cache", max_bytes=1 << 20, fingerprint=FP)
    write(store, 0)
    deadline = time.monotonic() + 10
    while set(_writers()) - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not set(_writers()) - before  # idle: the thread is gone
    write(store, 1)  # the next write starts another, which lands its page
    assert store.stats().pages == 2
    ref = weakref.ref(store)
    # An engine of another test in this process may hold the heap frozen, with a freeze owed to its next full
    # collection (gc_heap): let that collection freeze what it will now, then thaw, so the store can be collected.
    gc.collect()
    gc.unfreeze()
    del store
    gc.collect()
    deadline = time.monotonic() + 10
    while (ref() is not None or set(_writers()) - before) and time.monotonic() < deadline:
        time.sleep(0.02)
        gc.collect()
    assert ref() is None and not set(_writers()) - before
