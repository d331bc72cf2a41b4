"""A streamed trace read by a second process, so that reading and replaying a trace use two cores.

Decoding and checking a line (radixcache.trace.typed_lines) and replaying it through the tree are both Python-bound,
and a replay cannot be split: each request depends on the cache the ones before it left. What can run beside the
replay is the reading. `read_ahead(source)` iterates `source` in a child process and hands its requests over in
batches through a pipe (pickled: a few µs for a request that took 6 to 110 µs to read), so the replay's process only
unpickles and replays. The requests, their order, and every error are the same as iterating `source` here: a
TraceError at file:line arrives after every request before it, and is raised when the replay reaches it.

Memory stays bounded: the pipe holds little, so the reader blocks once it is a batch or two ahead. When the replay
stops early (an error of its own, or a consumer that closes the iterator), the reader's next send fails and it ends;
it is killed if it does not. The child is forked (on Linux; elsewhere `read_ahead` iterates `source` in this
process): a spawned child would import the caller's main module again, which a script without a `__main__` guard
does not survive. The forked child only reads the file and writes the pipe, so the locks a thread of the parent may
hold at the fork (a progress bar's) are never its concern.
"""

from __future__ import annotations

import multiprocessing
import sys
import warnings
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection
from typing import TypeVar

from radixcache.errors import RadixCacheError

T = TypeVar("T")

BATCH = 256  # requests per message: large enough that a send costs little per request, small enough to stay close


def read_ahead(source: Iterable[T], batch: int = BATCH) -> Iterator[T]:
    """The items of `source`, in order, read by a child process."""
    if not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods():
        yield from source
        return
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    reader = context.Process(target=_read, args=(source, sender, batch), daemon=True, name="radixcache-trace-reader")
    with warnings.catch_warnings():  # Python 3.12+ warns of any fork beside threads; see the module's note
        warnings.simplefilter("ignore", DeprecationWarning)
        reader.start()
    sender.close()  # the child's copy is the only one left: its end closes the pipe
    try:
        while True:
            try:
                kind, items, error = receiver.recv()
            except EOFError:
                raise RadixCacheError(
                    f"the trace reader process ended without a word (exit code {reader.exitcode})"
                ) from None
            yield from items
            if kind == "end":
                return
            if kind == "error":
                raise error
    finally:
        receiver.close()
        reader.join(timeout=5)
        if reader.is_alive():
            reader.kill()
            reader.join()


def _read(source: Iterable[T], sender: Connection, batch: int) -> None:
    """The child: iterate `source`, send ("more", items, None) batches, then ("end", items, None) or
    ("error", items, exception)."""
    items: list[T] = []
    try:
        for item in source:
            items.append(item)
            if len(items) >= batch:
                sender.send(("more", items, None))
                items = []
        sender.send(("end", items, None))
    except (BrokenPipeError, ConnectionResetError):  # the replay stopped reading: nothing left to do
        pass
    except BaseException as exc:  # every failure goes to the replay, which raises it where it was
        try:
            sender.send(("error", items, exc))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception:  # an exception that does not pickle: its type and message do
            sender.send(("error", items, RadixCacheError(f"{type(exc).__name__}: {exc}")))
    finally:
        sender.close()
