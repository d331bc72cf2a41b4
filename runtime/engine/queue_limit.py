"""The queue limit: how many requests may wait to be admitted, counted across threads (`max_queue`).

(Not page admission, which is radixcache.policy.admission: how many of a request's pages the tree adopts.)

A request enters when it is submitted and leaves once: when the scheduler first admits it, or when it ends without
ever being admitted (cancelled, timed out, refused). Past `max_queue` waiting requests, `enter` refuses new ones
with QueueFullError at once, on the caller's thread, so that a server can answer 429 without queueing anything; a
call of more requests than `max_queue` itself is a ValueError (a server's 400), since no wait would let it in.
The gate also keeps a moving average of how long admitted requests waited: the `retry_after` hint it gives.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence

from radixcache.runtime.engine.errors import QueueFullError
from radixcache.runtime.engine.request import Request

_SMOOTHING = 0.2  # weight of the newest wait in the moving average


def check_max_queue(max_queue: int | None) -> int | None:
    """`max_queue` itself when it is an int >= 0 or None (unbounded); otherwise a ValueError naming it."""
    if max_queue is not None and (isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 0):
        raise ValueError(f"max_queue must be an int >= 0 or None, got {max_queue!r}")
    return max_queue


class QueueGate:
    """Counts requests submitted but not yet admitted; `max_queue` None means unbounded."""

    def __init__(self, max_queue: int | None = None) -> None:
        self.max_queue = check_max_queue(max_queue)
        self._lock = threading.Lock()
        self._waiting = 0
        self._mean_wait_s = 0.0

    @property
    def waiting(self) -> int:
        return self._waiting

    def retry_after(self) -> float:
        """Seconds after which a refused caller may try again: the recent mean admission wait, at least 1 s."""
        return float(max(1, math.ceil(self._mean_wait_s)))

    def enter(self, reqs: Sequence[Request], queue_timeout: float | None = None) -> None:
        """Count `reqs`, the requests of one call, as waiting, all or none: raises QueueFullError (nothing counted)
        past the bound, and a ValueError for more requests in one call than the bound itself: those could never wait
        together, and a "try again later" (a server's 429) would be retried in vain. (`max_queue=0` refuses every
        call as full.) `queue_timeout`: the call's one deadline for admission, lifted for all of them once the first
        is admitted: the others then wait behind their own siblings (a fork past max_running), which no retry
        would change, not for an engine too busy to take the call."""
        if self.max_queue and len(reqs) > self.max_queue:
            raise ValueError(
                f"{len(reqs)} requests in one call (a batch, a group's samples or a fork's branches) can never be "
                f"queued together: the engine's max_queue is {self.max_queue}; submit at most that many at once"
            )
        with self._lock:
            if self.max_queue is not None and self._waiting + len(reqs) > self.max_queue:
                waiting = "1 request waits" if self._waiting == 1 else f"{self._waiting} requests wait"
                raise QueueFullError(
                    f"the engine's queue is full ({waiting} for admission, the limit is "
                    f"{self.max_queue}); try again later",
                    retry_after=self.retry_after(),
                )
            self._waiting += len(reqs)
        deadline = None if queue_timeout is None or not reqs else min(r.t_arrival for r in reqs) + queue_timeout
        call = list(reqs) if deadline is not None else []  # the requests whose deadline the first admission lifts
        for r in reqs:
            r.queue_deadline = deadline
            r.on_dequeue = lambda r=r: self._leave(r, call)

    def _leave(self, req: Request, call: list[Request]) -> None:
        """On the loop thread: `req` was admitted or left unadmitted (the scheduler checks deadlines there too)."""
        with self._lock:
            self._waiting -= 1
            if req.t_admitted is not None:
                wait = max(0.0, time.perf_counter() - req.t_arrival)
                self._mean_wait_s += _SMOOTHING * (wait - self._mean_wait_s)
        if req.t_admitted is not None and call:
            for r in call:  # the call was admitted: its others no longer wait on the engine's load
                r.queue_deadline = None
            call.clear()  # once: each later admission lifting them all again was O(n^2) on the loop (n: the call)
