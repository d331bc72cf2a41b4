"""The `radixcache` process's exit: the command's status without Python's teardown of the interpreter.

A process that imported torch spends about 0.65 s of CPU after its last line of Python (measured on this project's
2-core VM: 0.45 s tearing down modules, 0.2 s in libtorch's static destructors), whatever the command did: a
`radixcache` command waits that long after its output, and so does every CLI and server the test suite starts.
`exit_now` does what Python's own exit does first and skips the rest: it runs `threading`'s shutdown (its exit
callbacks, which stop executor workers, then joins every non-daemon thread) and the `atexit` handlers (logging's
flush, Ray's shutdown), flushes stdout and stderr, then ends the process with `os._exit`. Files the commands write are
closed by their own `with` blocks and `close()` calls before this point. Where this Python lacks either of the
two private hooks, it exits the ordinary way.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading


def exit_status(code: object) -> int:
    """The process status `SystemExit(code)` stands for, as Python computes it (a message goes to stderr: 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def exit_now(status: int) -> None:
    """End the process with `status` after threads, atexit handlers and stdio are done (see the module docstring)."""
    shutdown = getattr(threading, "_shutdown", None)
    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    if shutdown is None or run_handlers is None:
        sys.exit(status)
    shutdown()
    run_handlers()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken pipe: nothing more can be written anyway
            stream.flush()
    os._exit(status)
