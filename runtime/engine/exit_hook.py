"""Engines still running when the interpreter exits are stopped first, within a bound.

An engine's loop thread is a daemon: left running at exit, it may be inside torch while the interpreter finalises,
and C++ destructors there abort the process ("terminate called without an active exception", SIGABRT, seen once
after scripts/bench_engine.py printed its tables). So at exit (`atexit`, registered once, at the first engine):
every engine still referenced is closed (its requests cancelled, its loop thread waited for, its queued disk
writes finished and its trace recording closed: Engine.close), then every engine loop whose engine was dropped
but whose thread still runs is stopped (EngineLoop.stop). All of it waits at most `EXIT_WAIT_S` seconds in total,
so that an exit never hangs on a step that does not end.

Both are held weakly: tracking an engine never keeps it (its pool, its model) alive. A child made by `os.fork`
forgets them: they are its parent's to close. The engines it inherited have no loop thread there: each loop is told
(EngineLoop.after_fork_in_child); one that ran in the parent is dead in the child (its state said a thread ran, and
a close, or wait_idle, waited for it for ever), one that was idle stays usable.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any

EXIT_WAIT_S = 10.0  # the most an exit waits for every engine together

log = logging.getLogger("radixcache.engine")
_engines: weakref.WeakSet[Any] = weakref.WeakSet()  # Engines: `close(timeout)`
_loops: weakref.WeakSet[Any] = weakref.WeakSet()  # EngineLoops: `stop(timeout)`
_lock = threading.Lock()
_registered = False


def stop_at_exit(engine: Any, loop: Any) -> None:
    """Close `engine` and stop `loop` (its loop) if they still run when the interpreter exits."""
    global _registered
    with _lock:
        _engines.add(engine)
        _loops.add(loop)
        if not _registered:
            atexit.register(stop_all)
            _registered = True


def _forget_in_child() -> None:
    """After `os.fork`, in the child: the parent's engines are not this process's to stop (the lock too may have
    been held by another thread as the process forked)."""
    global _engines, _loops, _lock
    for loop in list(_loops):  # each loop takes in that no thread of its own runs here
        try:
            loop.after_fork_in_child()
        except Exception:
            log.exception("resetting an engine loop in a child of os.fork failed")
    _engines, _loops, _lock = weakref.WeakSet(), weakref.WeakSet(), threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def stop_all(wait_s: float = EXIT_WAIT_S) -> None:
    """Close every engine still referenced, then stop every loop still running, within `wait_s` seconds in all. An
    error is logged, never raised: the exit goes on."""
    deadline = time.monotonic() + wait_s
    with _lock:
        engines, loops = list(_engines), list(_loops)
    for stop in [*(e.close for e in engines), *(loop.stop for loop in loops)]:
        try:
            stop(max(0.0, deadline - time.monotonic()))
        except Exception:
            log.exception("stopping an engine at interpreter exit failed")
