"""A pinned Session that is collected without `unpin()` (saved, then let go) releases its share of the pin before
the engine's next step (tiny checkpoint, 256 pages of 16 tokens). Before, the share stayed locked until
`engine.unpin()` without a holder released every holder's. The release is posted to the loop, never waited for, so
a session collected on the loop thread itself (in a request's done-callback, or by a collection run there) neither
deadlocks nor changes the pin table mid-step."""

from __future__ import annotations

import copy
import gc
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.session import Session
from radixcache.runtime.testing import hold_engine_loop
from tests.runtime.structured.conftest import PAGE, make_engine

KW = {"pin": True, "max_new_tokens": 2, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Iterator[Engine]:
    with make_engine(tiny_dir, freeze_gc=False) as e:  # a frozen heap would hide a cycle from gc.collect
        yield e
        assert e.check()["locked_blocks"] == 0


def _pinned(engine: Engine, system: str) -> tuple[Session, int]:
    s = engine.session(system=system, **KW)
    r = s.send("hello there")
    assert r.pinned_tokens > 0
    return s, r.pinned_tokens // PAGE


def test_a_saved_session_let_go_releases_its_pin(engine: Engine, tmp_path: Path) -> None:
    s, pages = _pinned(engine, "a saved session " * 6)
    before = engine.check()
    assert before["pinned_blocks"] == before["locked_blocks"] == pages
    s.save(tmp_path / "s.json")
    gone = weakref.ref(s)
    del s
    gc.collect()
    assert gone() is None
    after = engine.check()  # the posted release runs before this command
    assert after["pinned_blocks"] == after["locked_blocks"] == 0 and len(engine.kv.pins) == 0
    assert after["evictable_blocks"] == before["evictable_blocks"] + pages  # the very pages, now evictable
    loaded = Session.load(engine, tmp_path / "s.json")  # the save still works: its pin is its own
    assert loaded.send("again").pinned_tokens > 0
    assert loaded.unpin() == 1 and engine.check()["locked_blocks"] == 0


def test_a_collected_session_releases_only_its_own_share(engine: Engine) -> None:
    system = "two holders " * 6
    kept, pages = _pinned(engine, system)
    dropped, _ = _pinned(engine, system)  # the very same prompt: one pin, two shares
    named = engine.session(system=system, pin_holder="mine", **KW)
    named.send("hello there")
    del dropped, named  # the named holder's share is not the session's to release
    gc.collect()
    assert engine.check()["pinned_blocks"] == pages
    assert kept.unpin() == 1 and engine.check()["pinned_blocks"] == pages  # "mine" still holds it
    assert engine.unpin(pin_holder="mine") == 1 and engine.check()["locked_blocks"] == 0


def _collect_on_loop(engine: Engine, box: list[Any], collect: bool) -> dict[str, Any]:
    """Drop the session in `box` inside a request's done-callback (the loop thread), with a full collection there
    when `collect`; what the callback saw."""
    seen: dict[str, Any] = {}
    ran = threading.Event()

    def drop(_: Future[Any]) -> None:
        try:
            gone = weakref.ref(box[0])
            box.clear()
            if collect:
                gc.collect()
            seen["thread"], seen["gone"] = threading.current_thread().name, gone() is None
        finally:
            ran.set()

    # The callback is added while the loop is held: a request that completed first (a loaded machine descheduling
    # this thread between the two calls) would run it at once on this thread, not the loop's.
    release = hold_engine_loop(engine)
    try:
        handle = engine.submit("a request whose end drops the session", 2, ignore_eos=True)
        handle.future.add_done_callback(drop)
    finally:
        release()
    handle.result(timeout=60)
    assert ran.wait(60)  # the callbacks run after the result's waiters wake
    return seen


@pytest.mark.parametrize("cycle", [False, True], ids=["refcount", "cycle-collected"])
def test_a_session_collected_on_the_loop_thread_releases_its_pin(engine: Engine, cycle: bool) -> None:
    s, _ = _pinned(engine, f"collected on the loop {cycle} " * 5)
    if cycle:
        s.defaults["me"] = s  # only the cyclic collector frees it
    box = [s]
    del s
    seen = _collect_on_loop(engine, box, collect=cycle)
    assert seen == {"thread": "radixcache-engine", "gone": True}
    gauges = engine.check()  # the loop went on: no deadlock, and the pin is gone
    assert gauges["pinned_blocks"] == gauges["locked_blocks"] == 0 and len(engine.kv.pins) == 0
    assert engine.generate("still serving", 2, ignore_eos=True).finish_reason == "length"


def test_unpin_later_returns_while_the_loop_is_busy_and_a_failing_post_is_logged(engine: Engine) -> None:
    """`unpin_later` only posts: it returns while the loop is held mid-command (a wait there would hang this test),
    and the release runs once the loop goes on; a posted call that raises is logged and the loop serves on."""
    s, _ = _pinned(engine, "released while the loop was held " * 4)
    holder = s._holder  # its own holder, as its finalizer names it
    release = hold_engine_loop(engine)
    try:
        engine.unpin_later(holder)
        engine._loop.post(lambda _: 1 / 0)
    finally:
        release()
    gauges = engine.check()
    assert gauges["pinned_blocks"] == gauges["locked_blocks"] == 0 and s.unpin() == 0
    assert engine.generate("still serving", 2, ignore_eos=True).finish_reason == "length"


def test_copy_module_copies_hold_pins_of_their_own(engine: Engine) -> None:
    """`copy.copy(session)` shared the session's holder and its list of pins: once the original was collected, the
    copy's own later pin was released under it. Both copies are `Session.copy()`s now: a holder of their own."""
    s, _ = _pinned(engine, "copied by the copy module " * 4)
    for twin in (copy.copy(s), copy.deepcopy(s)):
        assert twin._holder != s._holder and twin.messages == s.messages and twin.messages is not s.messages
    twin = copy.copy(s)
    r = twin.send("next")
    del s
    gc.collect()
    assert engine.check()["pinned_blocks"] == r.pinned_tokens // PAGE > 0  # the copy's pin stands
    assert twin.unpin() == 1 and engine.check()["locked_blocks"] == 0
