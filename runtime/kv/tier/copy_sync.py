"""The device-free decisions behind the tiers' CUDA-only paths: which host memory is pinned, in which order a load
on a side stream and the compute stream wait for each other, and when the host slots a load reads are free again.

On CUDA, `HostKVPool` and `KVTiers` run these with torch.cuda streams and events; on the CPU none of it is
needed (every copy is done when it returns). Kept here as plain functions over three small protocols, so that
tests drive the same logic on the CPU with stand-ins that record or model streams. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Generic, Protocol, TypeVar


class CopyStream(Protocol):
    """What a load needs of a stream (torch.cuda.Stream has it)."""

    def wait_stream(self, stream: Any) -> None: ...


class CopyEvent(Protocol):
    """What a load needs of an event (torch.cuda.Event has it)."""

    def record(self, stream: Any = None) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


S = TypeVar("S", bound=CopyStream)
E = TypeVar("E", bound=CopyEvent)
T = TypeVar("T")


def pins_host_memory(device_type: str) -> bool:
    """Whether the host tier's pages are pinned (page-locked) and its loads run on a side stream: only under a CUDA
    device. Pinned memory is what lets a host -> device copy run asynchronously beside the compute stream; on the
    CPU the device pool is host memory already, so pinning would only cost, and copies are synchronous."""
    return device_type == "cuda"


def side_stream_copy(
    main: S,
    side: S,
    copy: Callable[[], None],
    *,
    on_stream: Callable[[S], AbstractContextManager[Any]],
    new_event: Callable[[], E],
) -> E:
    """Queue `copy` on the `side` stream, ordered against `main` (the compute stream), and return its event.

    The order, and why:
    1. `side` waits for `main`: the destination blocks were just allocated, and kernels queued earlier on `main`
       may still read their previous contents;
    2. the copy is queued on `side` (`on_stream(side)` makes it the current stream);
    3. an event is recorded on `side` after the copy: when it completes, the source host slots have been read and
       may be overwritten (the caller keeps them locked until then);
    4. `main` waits for `side`: the prefill that reads the loaded pages runs after the copy.

    When `copy` raises partway, the copies it queued still run: `main` waits for them (the blocks' recomputed pages
    must land after any stale copy) and so does this call, before it raises, so the caller may unlock the host
    slots at once (no event to keep them locked by).
    """
    side.wait_stream(main)
    with on_stream(side):
        try:
            copy()
        except BaseException:
            queued = new_event()
            queued.record(side)
            main.wait_stream(side)
            queued.synchronize()
            raise
        done = new_event()
        done.record(side)
    main.wait_stream(side)
    return done


class PendingUnlocks(Generic[T]):
    """What host loads still in flight hold (their host pages, say), each with the event that marks the end of its
    copy.

    Invariant: each item is handed back exactly once, and only once its event completed (or was waited for): a host
    slot unlocked earlier could be evicted and overwritten by a save while the copy still reads it.
    """

    def __init__(self) -> None:
        self._waiting: list[tuple[CopyEvent, T]] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, event: CopyEvent, item: T) -> None:
        self._waiting.append((event, item))

    def finished(self) -> list[T]:
        """The items whose copies have completed (`event.query()`), in the order the loads were issued; the others
        keep waiting. Never blocks."""
        done, still = [], []
        for event, item in self._waiting:
            if event.query():
                done.append(item)
            else:
                still.append((event, item))
        self._waiting = still
        return done

    def drain(self) -> list[T]:
        """Wait for every copy (`event.synchronize()`), in issue order, and hand back every item."""
        out = []
        for event, item in self._waiting:
            event.synchronize()
            out.append(item)
        self._waiting = []
        return out
