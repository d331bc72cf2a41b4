"""The server's control reads (/metrics, /health/cache) off the event loop, in threads of their own.

Behind replicas each is a Ray call to every replica, which a frozen one (alive, answering nothing) holds for its
whole bound. In the event loop's default executor (min(32, cores + 4) threads, shared with every request's
tokenising and submitting) six scrapes at once held all six threads of a 2-core machine, and every chat request,
to healthy replicas too, waited behind them. Here they run in CONTROL_THREADS threads of their own, and reads of one
kind that arrive while one is in flight share its answer: a scraper (or many) holds at most one thread per kind.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

CONTROL_THREADS = 2  # one per kind of read (/metrics, /health/cache)


class ControlReads:
    """`await reads.run(kind, fn, *args)`: `fn(*args)` in a control thread; a call of `kind` made while one is in
    flight waits for that one's answer (or error) instead of starting its own."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None  # made at the first read, and again after `close`
        self._inflight: dict[str, asyncio.Future[Any]] = {}

    async def run(self, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        shared = self._inflight.get(kind)
        if shared is None or shared.get_loop() is not loop:  # a future of another loop (a new TestClient) is not ours
            if self._executor is None:
                self._executor = ThreadPoolExecutor(CONTROL_THREADS, thread_name_prefix="radixcache-control")
            shared = loop.run_in_executor(self._executor, functools.partial(fn, *args))
            self._inflight[kind] = shared
            shared.add_done_callback(functools.partial(self._finished, kind))
        return await asyncio.shield(shared)  # one caller gone (cancelled) leaves the others their answer

    def _finished(self, kind: str, future: asyncio.Future[Any]) -> None:
        if self._inflight.get(kind) is future:
            del self._inflight[kind]
        if not future.cancelled():
            future.exception()  # retrieved: an error no caller awaited any more is not logged as never retrieved

    def close(self) -> None:
        """Let the threads go once their reads end (the app's shutdown): an app made per test kept two for good."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
