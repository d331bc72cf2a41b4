"""The front door's requests and handles (runtime.cluster.front): a request in flight on a replica, read by the server's
streaming code as an engine Request is, and the handle a caller waits on, as an engine RequestHandle."""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from radixcache.runtime.engine.loop import GuardedFuture
from radixcache.runtime.kv.tier.disk_writer import wait_bound
from radixcache.runtime.tools.use import CallIds


@dataclass(slots=True)
class RemoteRequest:
    """A request in flight on a replica, as the server's streaming code reads an engine Request: the tokens so far,
    their logprobs, a listener called as they grow, the stop ids of its sampling parameters, and the ids its tool
    calls get (the stream's and the result's: the replica's own ids are replaced by these)."""

    rid: str
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    listener: Any = None
    sampler: Any = None
    replica: int | None = None
    call_ids: CallIds | None = None
    started: bool = False  # its replica (the last it was sent to) has sent an item: admitted, or ended


class RemoteHandle:
    """`RequestHandle`'s shape: `future`, `result`, `done`, `cancel`, `request`, `rid`."""

    def __init__(self, request: RemoteRequest, cancel: Any) -> None:
        self.request = request
        # Guarded as an Engine handle's: a done-callback that raises (sys.exit() in an agent's hook) is logged, and the
        # callbacks after it (an asyncio waiter, the server's wake-up) still run; it ended them there, and its waiter
        # waited for ever.
        self.future: Future[Any] = GuardedFuture()
        # time.monotonic() when the front door took it: its timeout counts from here (its queue timeout too, until
        # admitted). The front door's own clock only: a replica is sent durations, never this reading.
        self.sent_at = time.monotonic()
        self.cancelled = False  # set before the cancel is sent: a dispatch after it cancels on the replica too
        # its result when it ends before its replica started it (finish_reason -> GenerationResult): a cancel of a
        # request still waiting in Ray's queue ends it at once, as one engine ends a queued request
        self.unstarted: Callable[[str], Any] | None = None
        self._cancel = cancel
        # A caller that cancels the future (an asyncio waiter through `wrap_future`, cancelled with its task or by
        # wait_for's timeout) wants no result: the request is cancelled on its replica too, as an Engine's handle
        # aborts it (it ran there to its length for nobody, its load counted). A weak reference: no handle <-> future
        # cycle; the request's thread holds the handle while it runs.
        self.future.add_done_callback(functools.partial(_cancel_if_cancelled, weakref.ref(self)))

    @property
    def rid(self) -> str:
        return self.request.rid

    def result(self, timeout: float | None = None) -> Any:
        return self.future.result(wait_bound(timeout))  # checked as RequestHandle.result checks it

    def done(self) -> bool:
        return self.future.done()

    def cancel(self) -> None:
        self._cancel(self)


def _cancel_if_cancelled(handle: weakref.ref[RemoteHandle], future: Future[Any]) -> None:
    alive = handle()
    if future.cancelled() and alive is not None:
        alive.cancel()


@dataclass(slots=True)
class SeenTimes:
    """When the front door saw a request's replica admit it, send its first token and end it (time.monotonic()).
    A result's times count from when the front door took the request, as one Engine's count from `submit`: its
    replica's engine counted them from its own arrival, leaving out the routing, the way there, a wait in Ray's
    queue for an actor thread and the time on a replica that died before the request was re-sent."""

    admitted: float | None = None
    first: float | None = None
    end: float | None = None

    def saw(self, kind: str) -> None:
        """An item of `kind` ("admitted", "tokens" or "done") arrived now."""
        now = time.monotonic()
        if kind == "admitted" and self.admitted is None:
            self.admitted = now
        elif kind == "tokens" and self.first is None:
            self.first = now
        elif kind == "done":
            self.end = now

    def applied(self, result: Any, took: float) -> Any:
        """`result` with queue_s, ttft_s and latency_s counted from `took` (when the front door took the request):
        to its admission (its end, when it was never admitted), its first token (its end, without one), its end."""
        end = time.monotonic() if self.end is None else self.end
        first = end if self.first is None else self.first
        admitted = end if self.admitted is None else self.admitted
        return replace(result, queue_s=admitted - took, ttft_s=first - took, latency_s=end - took)


class FrontQueue:
    """The front door's `queue`, as an Engine's: `waiting` is how many of its requests no replica has started yet
    (sent to the front door, and no admission or first item back from their replica); read without a Ray call."""

    def __init__(self) -> None:
        self._waiting: set[str] = set()  # request ids
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def mark(self, rid: str, waiting: bool) -> None:
        """`rid` waits for a replica to start it (sent, or re-sent after its replica died), or no longer does."""
        with self._lock:
            if waiting:
                self._waiting.add(rid)
            else:
                self._waiting.discard(rid)


class CallAdmission:
    """The one admission deadline of a call's several requests (a group's n samples), as one Engine gives them
    (runtime.engine.queue_limit.QueueGate.enter): `by` (time.monotonic()) until the first of them is admitted, then
    None for all, since the others then wait behind their own siblings (n past max_running), which no retry would
    change. The front door holds it: their replicas' engines set none of their own (each sample is its own request
    there, and timed out behind its siblings)."""

    def __init__(self, queue_timeout: float) -> None:
        self.by: float | None = time.monotonic() + queue_timeout

    def admitted(self) -> None:
        self.by = None
