"""A replay run in a forked process beside this one, for replays that need no look at each other (the bounds).

`evaluate` with `parallel=True` starts Belady's replays this way, then runs the policy's replay itself: on two
cores the whole report costs about what its slowest replay does, instead of their sum. The child returns its result
(a SimResult) or its exception through a pipe; the parent gets it from `result()`. Forked, as in
radixcache.sim.read_ahead, on Linux only; elsewhere `result()` runs the call in this process.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

from radixcache.errors import RadixCacheError

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def can_fork() -> bool:
    """Whether this process may fork a helper: on Linux, and not from a daemonic process (a pool's worker), which
    multiprocessing forbids to have children (the work then runs in this process)."""
    return (
        sys.platform.startswith("linux")
        and "fork" in multiprocessing.get_all_start_methods()
        and not multiprocessing.current_process().daemon
    )


def start_child(target: Callable[..., None], args: tuple, name: str) -> tuple[Any, Connection]:
    """Fork a daemonic child running `target(*args, sender)`, where `sender` is the write end of a pipe; return the
    process and the read end. The parent keeps no copy of the write end, so the pipe closes when the child does."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=_child, args=(target, receiver, os.getpid(), *args, sender), daemon=True, name=name
    )
    with warnings.catch_warnings():  # Python 3.12+ warns of any fork beside threads: the child never meets them
        warnings.simplefilter("ignore", DeprecationWarning)
        process.start()
    sender.close()
    return process, receiver


def _child(target: Callable[..., None], receiver: Connection, parent: int, *args: Any) -> None:
    """The forked child: die with `parent`, close its copy of the read end, then run `target(*args)`. While that copy
    is open, a send to a parent that stopped reading (a replay that stops early) blocks for ever instead of raising
    BrokenPipeError, and the parent waited 5 s for the child before killing it."""
    _die_with(parent)
    receiver.close()
    target(*args)


def _die_with(parent: int) -> None:
    """Have the kernel kill this process when `parent` dies (Linux's PR_SET_PDEATHSIG). A parent killed by a signal
    (`timeout`, a scheduler's SIGTERM) skips multiprocessing's exit, which stops daemonic children: a replay nobody
    will read ran on to its end, then printed two BrokenPipeError tracebacks. (The kernel sends it when the thread
    that forked ends: ForkedCall and read_ahead wait for their child in that thread.)"""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (AttributeError, OSError):  # no prctl here: the child runs on, as before
        return
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(0)


class ForkedCall(Generic[T]):
    """`call()` started now in a forked child (where one can be forked); `result()` waits for its value."""

    def __init__(self, call: Callable[[], T]) -> None:
        self.call = call
        self.process: Any = None
        self.receiver: Connection | None = None
        if not can_fork():
            return
        self.process, self.receiver = start_child(_run, (call,), "radixcache-replay")

    def result(self) -> T:
        """The call's value, or its exception raised here."""
        if self.process is None:
            return self.call()
        assert self.receiver is not None
        try:
            kind, value = self.receiver.recv()
        except EOFError:
            self.process.join()
            code = self.process.exitcode
            raise RadixCacheError(f"a replay's process ended without a result (exit code {code})") from None
        finally:
            self.receiver.close()
        self.process.join()
        if kind == "error":
            raise value
        return value

    def cancel(self) -> None:
        """Stop the child (the caller failed and will not ask for the result)."""
        if self.process is not None and self.process.is_alive():
            self.process.kill()
            self.process.join()


def _run(call: Callable[[], Any], sender: Connection) -> None:
    try:
        value = call()
        message = ("value", value)
    except BaseException as exc:  # sent to the parent, which raises it
        message = ("error", exc)
    try:
        sender.send(message)
    except BrokenPipeError:  # the parent stopped reading: nobody wants the result
        pass
    except Exception:  # an exception (or a value) that does not pickle: its type and message do
        sender.send(("error", RadixCacheError(f"{type(message[1]).__name__}: {message[1]}")))
    finally:
        sender.close()
