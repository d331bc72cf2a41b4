"""The requests a replay has in flight, and when each one finishes.

A trace that does not say when its requests finished runs with `concurrency` requests in flight: a request finishes
(its pages go into the tree) once `concurrency` later requests have arrived, first in, first out. A trace an engine
recorded says when each request left the engine (`SimRequest.finish_ms`): such a request finishes at that time, so a
next turn that arrived after its predecessor's answer finds that answer cached, and requests that ran side by side
in the engine run side by side here, whatever `concurrency` says. Finishing "at that time" means before the first
request that arrived at or after it starts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from heapq import heappop, heappush
from itertools import count
from typing import Any


class InFlight:
    """In-flight items: those without a finish time first in, first out, `concurrency` at most; those with one by
    their finish times. `due(t)` yields, to be finished in this order, every item done before a request arriving at
    `t` starts; `drain()` the rest."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._fifo: deque = deque()
        self._timed: list[tuple[float, int, Any]] = []  # (finish time, arrival order, item): a heap
        self._order = count()
        # Whether a request was ever added while another was in flight: then the replay is no longer one request at
        # a time (`concurrency` above 1, or a recorded trace's overlapping finish times), and Belady is no bound.
        self.overlapped = False

    def __len__(self) -> int:
        return len(self._fifo) + len(self._timed)

    def add(self, item: Any, finish_ms: float | None) -> None:
        if self._fifo or self._timed:
            self.overlapped = True
        if finish_ms is None:
            self._fifo.append(item)
        else:
            heappush(self._timed, (finish_ms, next(self._order), item))

    def due(self, arrival_ms: float) -> Iterator[Any]:
        """The items that finish before a request arriving at `arrival_ms` starts (consume them all before it)."""
        timed = self._timed
        while timed and timed[0][0] <= arrival_ms:
            yield heappop(timed)[2]
        fifo = self._fifo
        while len(fifo) >= self.concurrency:
            yield fifo.popleft()

    def drain(self) -> Iterator[Any]:
        """Every item left, in finishing order: those with a finish time by it, then the rest as they came."""
        while self._timed:
            yield heappop(self._timed)[2]
        while self._fifo:
            yield self._fifo.popleft()
