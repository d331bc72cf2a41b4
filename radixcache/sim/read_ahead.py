"""A streamed trace read by a second process, so that reading and replaying a trace use two cores.

Decoding and checking a line (radixcache.trace.typed_lines) and replaying it through the tree are both Python-bound,
and a replay cannot be split: each request depends on the cache the ones before it left. What can run beside the
replay is the reading. `read_ahead(source)` iterates `source` in a child process and hands its requests over in
batches through a pipe, so the replay's process only unpickles and replays. The simulator's requests cross packed
(radixcache.sim.packing: a batch's ids as one buffer), so that unpickling never makes a Python int of an id.
The requests, their order, and every error are the same as iterating `source` here: a TraceError at file:line
arrives after every request before it, and is raised when the replay reaches it.

The reader has time to spare (reading a hash trace's line costs a seventh of replaying it), so a cheap replay can
run there too (`ReadAhead(beside=...)`): `evaluate` runs the infinite-cache bound so.

Memory stays bounded: the pipe holds little, so the reader blocks once it is a batch or two ahead. When the replay
stops early (an error of its own, or a consumer that closes the iterator), the reader's next send fails and it ends;
it is killed if it does not. The child is forked (on Linux; elsewhere the same pass runs in this process): a
spawned child would import the caller's main module again, which a script without a `__main__` guard does not
survive. The forked child only reads the file, replays what runs beside, and writes the pipe, so the locks a thread
of the parent may hold at the fork (a progress bar's) are never its concern.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from typing import Any, Generic, Protocol, TypeVar

from radixcache.errors import RadixCacheError
from radixcache.sim.fork import can_fork, start_child

T = TypeVar("T")

BATCH = 256  # requests per message: large enough that a send costs little per request, small enough to stay close


class Beside(Protocol):
    """A replay that runs in the reader process, fed every item as it is read (InfiniteReplay is one)."""

    def feed(self, index: int, item: Any) -> None: ...

    def close(self) -> None: ...

    def summary(self) -> Any:
        """What the caller gets back (`ReadAhead.beside_summary`): it must pickle."""
        ...


class Packer(Protocol[T]):
    """Takes items one by one (`add`) and gives those added since the last `take` as one message."""

    def add(self, item: T) -> None: ...

    def take(self) -> Any: ...

    def __len__(self) -> int: ...


class _Unpacked(Generic[T]):
    """The default Packer: the items themselves, in a list."""

    def __init__(self) -> None:
        self.items: list[T] = []

    def add(self, item: T) -> None:
        self.items.append(item)

    def take(self) -> list[T]:
        items, self.items = self.items, []
        return items

    def __len__(self) -> int:
        return len(self.items)


class ReadAhead(Generic[T]):
    """The items of `source`, in order, read by a child process; iterating it once is one pass over `source`.

    `beside`: a factory of a replay that the child also feeds every item (a bound whose replay costs far less than
    the caller's, such as the infinite cache, then costs the caller nothing). After a whole pass, its
    `summary()` is in `beside_summary`.

    `pack` makes, in the child, a Packer that takes the items one by one as they are read and gives a batch of them
    as what crosses the pipe; `unpack` turns that back into the items, here (the simulator's requests:
    radixcache.sim.packing). Both or neither; without them the items are pickled as they are.
    """

    def __init__(
        self,
        source: Iterable[T],
        beside: Callable[[], Beside] | None = None,
        batch: int = BATCH,
        pack: Callable[[], Packer[T]] | None = None,
        unpack: Callable[[Any], list[T]] | None = None,
    ) -> None:
        if (pack is None) != (unpack is None):
            raise ValueError("ReadAhead: give both pack and unpack, or neither")
        self.source, self.beside, self.batch = source, beside, batch
        self.pack, self.unpack = pack, unpack
        self.beside_summary: Any = None

    def __iter__(self) -> Iterator[T]:
        if not can_fork():
            yield from self._here()
            return
        reader, receiver = start_child(
            _read, (self.source, self.batch, self.beside, self.pack), "radixcache-trace-reader"
        )
        unpack = self.unpack
        try:
            while True:
                try:
                    kind, items, extra = receiver.recv()
                except EOFError:
                    raise RadixCacheError(
                        f"the trace reader process ended without a word (exit code {reader.exitcode})"
                    ) from None
                yield from (items if unpack is None else unpack(items))
                if kind == "end":
                    self.beside_summary = extra
                    return
                if kind == "error":
                    raise extra
        finally:
            receiver.close()
            reader.join(timeout=5)
            if reader.is_alive():
                reader.kill()
                reader.join()

    def _here(self) -> Iterator[T]:
        """The same pass without a child (where none can be forked)."""
        side = self.beside() if self.beside is not None else None
        for index, item in enumerate(self.source):
            if side is not None:
                side.feed(index, item)
            yield item
        if side is not None:
            side.close()
            self.beside_summary = side.summary()


def read_ahead(
    source: Iterable[T],
    batch: int = BATCH,
    pack: Callable[[], Packer[T]] | None = None,
    unpack: Callable[[Any], list[T]] | None = None,
) -> Iterator[T]:
    """The items of `source`, in order, read by a child process (`pack`, `unpack`: see ReadAhead)."""
    return iter(ReadAhead(source, batch=batch, pack=pack, unpack=unpack))


def _read(
    source: Iterable[T],
    batch: int,
    beside: Callable[[], Beside] | None,
    pack: Callable[[], Packer[T]] | None,
    sender: Connection,
) -> None:
    """The child: iterate `source` (feeding `beside`'s replay), send ("more", items, None) batches, then
    ("end", items, the replay's summary) or ("error", items, exception); items as `pack`'s packer gives them."""
    packer: Packer[T] = _Unpacked() if pack is None else pack()
    try:
        side = beside() if beside is not None else None
        for index, item in enumerate(source):
            packer.add(item)
            if side is not None:
                side.feed(index, item)
            if len(packer) >= batch:
                sender.send(("more", packer.take(), None))
        summary = None
        if side is not None:
            side.close()
            summary = side.summary()
        sender.send(("end", packer.take(), summary))
    except (BrokenPipeError, ConnectionResetError):  # the replay stopped reading: nothing left to do
        pass
    except BaseException as exc:  # every failure goes to the replay, which raises it where it was
        try:
            sender.send(("error", packer.take(), exc))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception:  # an exception that does not pickle: its type and message do
            sender.send(("error", packer.take(), RadixCacheError(f"{type(exc).__name__}: {exc}")))
    finally:
        sender.close()
