"""How the front door awaits each item of a replica's stream (runtime.cluster.front), or a blocking call's answer
(ReplicaCluster.generate): at most the cluster's `call_timeout` (a replica that stops sending is not waited on for
ever), not past the request's admission deadline (the queue timeout, which the front door holds itself), and not
past its `timeout` and a grace (`end_by`). A stream's `timeout` is held here too (`TimeoutCut`): its replica counts
it from when its call starts there, which leaves out a wait in Ray's queue for an actor thread."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from radixcache.runtime.engine.errors import QueueTimeoutError, ReplicaUnavailableError

if TYPE_CHECKING:  # the protocol of what is read of runtime.cluster.cluster.ReplicaCluster (which imports this module)
    from radixcache.runtime.cluster.fanout import ReplicaCluster

# The front door fails a request its replica has not ended within its `timeout` plus this (the replica's step that
# ends it, and its result's way back, get this long: a slow replica still ends it with what it generated).
TIMEOUT_GRACE_S = 10.0


# The front door cancels a request its replica has not ended within its `timeout` plus this (the replica's own end,
# "timeout", gets the first chance: it is ahead of this unless the request waited in Ray's queue for an actor thread).
CUT_GRACE_S = 0.25


class NotStarted(Exception):
    """A request whose `timeout` passed before its replica sent anything (waiting in Ray's queue for an actor
    thread, or in its engine's queue): cancelled there; the front door ends it with "timeout" itself."""


class TimeoutCut:
    """The front door's hold of a request's `timeout`, counted from when it took the request (`sent_at`), on its own
    clock. Its replica counts the same timeout from when its call starts there, less the seconds spent before the
    send: a wait in Ray's queue for an actor thread (past the actor's max_concurrency) is not in that count, so the
    request ran on for as long past its timeout. Past `by` (the timeout and CUT_GRACE_S) `answered` cancels it on its
    replica (`fired`: the front door reports the replica's "cancelled" end as "timeout"); one whose replica has sent
    nothing yet (`started` False) raises NotStarted there and then. `sent()` at each send to a replica."""

    def __init__(self, sent_at: float, timeout: float | None) -> None:
        self.by = None if timeout is None else sent_at + timeout + CUT_GRACE_S
        self.fired = False  # a cancel was sent for the timeout
        self.started = False  # its replica (this send's) has sent an item
        self._due = self.by is not None  # not yet cancelled on this send's replica

    def sent(self) -> None:
        self.started, self._due = False, self.by is not None

    def wait_until(self) -> float | None:
        """When the cut is next due (time.monotonic()), or None."""
        return self.by if self._due else None

    def fire(self, cluster: ReplicaCluster, replica: int, rid: str) -> None:
        """Past `by`: cancel the request on `replica`; NotStarted if it has sent nothing."""
        self._due, self.fired = False, True
        cluster.control(replica, "cancel").remote(rid)
        if not self.started:
            raise NotStarted(f"request {rid} was not started on engine replica {replica} within its timeout")


def end_by(sent_at: float, timeout: float | None) -> float | None:
    """When (time.monotonic()) the front door gives up on a request it took at `sent_at` with `timeout` (None: never):
    its replica ends it at its timeout, and a frozen replica ends nothing."""
    return None if timeout is None else sent_at + timeout + TIMEOUT_GRACE_S


def next_item(
    cluster: ReplicaCluster,
    stream: Any,
    replica: int,
    rid: str,
    admit_by: Callable[[], float | None] | None = None,
    end_by: float | None = None,
    cut: TimeoutCut | None = None,
) -> Any:
    """The stream's next item (an object ref), awaited at most `call_timeout` seconds. A replica that sends
    nothing for that long has the request cancelled there and the caller gets ReplicaUnavailableError (503).
    A dead replica's stream has its next item at once: the actor error, raised by `ray.get`. `admit_by()`
    (time.monotonic(), or None; read at each wait, as a call's deadline is lifted once any of it is admitted): a
    request not yet admitted by then is cancelled there and fails with QueueTimeoutError,
    as the replica's engine would have failed it, without waiting for that verdict to come back. `end_by`
    (time.monotonic()): past it (the request's `timeout` and a grace for its replica to end it and say so) it is
    cancelled there and fails with ReplicaUnavailableError: a frozen replica ends nothing, and the request's
    timeout (the server's --request-timeout) is the most its caller waits. `cut`: the front door's own hold of that
    timeout (TimeoutCut), which cancels it there past it."""
    if not answered(cluster, stream, replica, rid, admit_by, end_by, cut):
        cluster.control(replica, "cancel").remote(rid)  # it stops computing; its stream then ends on its own
        raise ReplicaUnavailableError(
            f"engine replica {replica} sent nothing for {cluster.call_timeout} s; the request was cancelled"
        )
    try:
        return next(stream)
    except StopIteration:  # ended without its ("done", result) item (Ray reports a failure as an item)
        raise ReplicaUnavailableError(f"the stream from engine replica {replica} ended early") from None


def answered(
    cluster: ReplicaCluster,
    ref: Any,
    replica: int,
    rid: str,
    admit_by: Callable[[], float | None] | None = None,
    end_by: float | None = None,
    cut: TimeoutCut | None = None,
) -> bool:
    """Wait until `ref` (a stream, or a call's answer) is ready: True; False once `call_timeout` has passed (the
    caller cancels the request and says so). Past `admit_by()` or `end_by`, as `next_item` says, the request is
    cancelled on its replica and the error raised; past `cut`'s bound it is cancelled there (TimeoutCut.fire)."""
    start = time.monotonic()
    while True:
        now = time.monotonic()
        by = None if admit_by is None else admit_by()
        if by is not None and now >= by:
            cluster.control(replica, "cancel").remote(rid)
            timeout = cluster.queue_timeout
            raise QueueTimeoutError(
                f"request {rid} was not admitted within the queue timeout of {timeout} s", retry_after=timeout
            )
        if end_by is not None and now >= end_by:
            cluster.control(replica, "cancel").remote(rid)
            raise ReplicaUnavailableError(
                f"engine replica {replica} did not end request {rid} at its timeout; the request was cancelled"
            )
        cut_at = None if cut is None else cut.wait_until()
        if cut_at is not None and now >= cut_at:
            cut.fire(cluster, replica, rid)  # type: ignore[union-attr]
            cut_at = None
        left = cluster.call_timeout - (now - start)
        if left <= 0:
            return False
        bounds = [left, *(at - now for at in (by, end_by, cut_at) if at is not None)]
        ready, _ = cluster.ray.wait([ref], timeout=min(bounds))
        if ready:
            return True
