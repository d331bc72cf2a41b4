"""An engine inherited by a child of `os.fork` while its loop thread ran in the parent: the child has no such
thread, but the loop's state said one ran, so `close()` and `wait_idle()` called by hand spun for ever (wait_idle
had no deadline check once the thread was dead). The child now finds the engine dead (EngineDeadError on every
call, close returns at once), and wait_idle honours its timeout whatever the thread's state."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import EngineClosedError, EngineDeadError
from radixcache.runtime.testing import tiny_model

BOUND_S = 60.0  # generous: a child that has not exited by then spins


def _child_exit_code(pid: int) -> int | None:
    """The child's exit code, or None if it was still running after BOUND_S (then killed)."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _in_child(engine: Engine) -> int:
    """What a child checks of the engine it inherited: a nonzero code names the first check that failed."""
    if engine.wait_idle(None) is not True:  # no thread runs here: nothing to wait for
        return 2
    try:
        engine.generate([1, 2, 3], 2)
        return 3
    except EngineDeadError as exc:
        if "os.fork" not in str(exc):
            return 4
    if engine.close() is not True or engine.close(None) is not True:
        return 5
    try:
        engine.generate([1, 2, 3], 2)
        return 6
    except EngineClosedError:
        return 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_an_engine_inherited_by_fork_while_generating_is_dead_in_the_child_and_closes_at_once() -> None:
    engine = Engine(tiny_model(seed=1, max_position=40_000), capacity_blocks=2600, page_size=16, threads=1)
    handle = engine.submit([1, 2, 3, 4, 5], 30_000, ignore_eos=True)
    while not handle.request.output_ids:  # generating now
        time.sleep(0.01)
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            code = _in_child(engine)
        finally:
            os._exit(code)
    try:
        assert _child_exit_code(pid) == 0
        assert handle.request.finish_reason is None, "the parent's request runs on, untouched"
    finally:
        assert engine.close(60)
    assert handle.result(60).finish_reason == "cancelled"


def test_wait_idle_honours_its_timeout_when_the_loop_thread_died_without_clearing_its_state() -> None:
    engine = Engine(tiny_model(seed=1), capacity_blocks=16, page_size=4, threads=1)
    gone = threading.Thread(target=lambda: None)
    gone.start()
    gone.join()
    engine._loop._thread = gone  # what a child of os.fork saw of its parent's running loop
    answers: list[bool] = []
    waiter = threading.Thread(target=lambda: answers.extend([engine.wait_idle(0.2), engine.wait_idle(None)]))
    waiter.daemon = True
    waiter.start()
    waiter.join(BOUND_S)
    assert not waiter.is_alive(), "wait_idle spun past its timeout"
    assert answers == [False, False]
    engine._loop._thread = None
