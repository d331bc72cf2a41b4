"""The wake-ups of a stream's choices, from the engine's thread to the event loop: one loop wake for every choice
the engine told since the loop last looked, not one per choice (a `call_soon_threadsafe` per request per step made
a 64-choice stream's engine thread and event loop trade the GIL 64 times a step)."""

from __future__ import annotations

import asyncio
import threading


class Wakes:
    """One stream's choices, each with an event its reader awaits. `mark(i)` (on any thread: the engine's listener,
    a future's done callback) notes that choice i has news; the first mark since the loop last looked schedules one
    call on the loop, which sets the event of every choice marked meanwhile. A mark never waits for the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, choices: int) -> None:
        self._loop = loop
        self._events = [asyncio.Event() for _ in range(choices)]
        self._marked: list[int] = []  # choices marked since the loop last looked: a call to deliver them is scheduled
        self._lock = threading.Lock()
        self.calls = 0  # loop wakes scheduled

    def mark(self, i: int) -> None:
        """Choice i has news. Once the loop is closed (its reader gone), raises RuntimeError as
        `call_soon_threadsafe` does, at every mark: the scheduler then drops the listener and fails the request."""
        with self._lock:
            first = not self._marked
            self._marked.append(i)
            self.calls += first
        if first:
            self._loop.call_soon_threadsafe(self._deliver)
        elif self._loop.is_closed():  # the call scheduled before may never run
            raise RuntimeError("Event loop is closed")

    def _deliver(self) -> None:
        with self._lock:
            marked, self._marked = self._marked, []
        for i in marked:
            self._events[i].set()

    async def wait(self, i: int) -> None:
        """Until choice i has news since its last wait."""
        event = self._events[i]
        await event.wait()
        event.clear()
