"""The engine loop: one thread owns the scheduler (and so the cache and the KV pool); callers on any thread
submit requests and wait on futures.

The thread starts when work arrives and ends when there is none left, so an idle engine holds no thread.
Results and errors travel back through `concurrent.futures.Future` (wrap it with `asyncio.wrap_future` to
await it); streaming callers get each new token through the request's listener, called on the loop thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from radixcache.runtime.engine.request import GenerationResult, Request, dequeued
from radixcache.runtime.engine.scheduler import Scheduler
from radixcache.runtime.engine.trace_recorder import TraceRecorder, earliest_arrival
from radixcache.runtime.native.openmp import release_idle_team


class RequestHandle:
    """A submitted request: wait for its result, or cancel it at any moment."""

    def __init__(self, loop: EngineLoop, req: Request) -> None:
        self.request = req
        self.future: Future[GenerationResult] = Future()
        self._loop = loop

    @property
    def rid(self) -> int:
        return self.request.rid

    def result(self, timeout: float | None = None) -> GenerationResult:
        return self.future.result(timeout)

    def done(self) -> bool:
        return self.future.done()

    def cancel(self) -> None:
        """Abort the request (its blocks are freed at the next step); its result has finish_reason "cancelled"."""
        self._loop.call(lambda s: s.abort(self.request, "cancelled"))


class EngineLoop:
    """Runs `scheduler.step()` on its own thread while there is work; applies commands between steps."""

    def __init__(
        self, scheduler: Scheduler, finish: Callable[[Request], GenerationResult], num_threads: int | None = None
    ) -> None:
        self.scheduler = scheduler
        self.num_threads = num_threads
        self._finish = finish
        self._cv = threading.Condition()
        self._inbox: list[Callable[[Scheduler], Any]] = []
        self._handles: dict[int, RequestHandle] = {}
        self._thread: threading.Thread | None = None
        self.recorder: TraceRecorder | None = None  # sees every request that leaves (Engine.record_trace)

    def submit(self, req: Request) -> RequestHandle:
        return self.submit_many([req])[0]

    def submit_many(
        self, reqs: list[Request], prepare: Callable[[Scheduler], None] | None = None
    ) -> list[RequestHandle]:
        """Queue requests without waiting: they reach the scheduler together, between two steps. `prepare` runs on
        the loop thread just before they are added (to read the cache's state at that moment)."""
        handles = [RequestHandle(self, r) for r in reqs]

        def add_all(s: Scheduler) -> None:
            if prepare is not None:
                try:
                    prepare(s)
                except BaseException as exc:
                    for handle in handles:
                        dequeued(handle.request)
                        handle.future.set_exception(exc)
                    return
            for handle in handles:
                try:
                    s.add(handle.request)
                except BaseException as exc:
                    dequeued(handle.request)
                    handle.future.set_exception(exc)
                    continue
                self._handles[handle.rid] = handle

        self.call(add_all)
        return handles

    def call(self, fn: Callable[[Scheduler], Any]) -> Future[Any]:
        """Run `fn(scheduler)` on the loop thread between steps; its return value comes back in the future."""
        fut: Future[Any] = Future()

        def run(s: Scheduler) -> None:
            try:
                fut.set_result(fn(s))
            except BaseException as exc:
                fut.set_exception(exc)

        with self._cv:
            self._inbox.append(run)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="radixcache-engine", daemon=True)
                self._thread.start()
            self._cv.notify()
            on_loop = threading.current_thread() is self._thread
        if not on_loop:  # the caller is about to wait: its idle OpenMP team would throttle the loop (native.openmp)
            release_idle_team()
        return fut

    def idle(self) -> bool:
        with self._cv:
            return self._thread is None

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is in flight and the loop thread has exited. Returns False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cv:
                thread = self._thread
            if thread is None:
                return True
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        s = self.scheduler
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)  # per thread in OpenMP: a new thread starts from the default
        try:
            with torch.inference_mode():
                while True:
                    with self._cv:
                        commands, self._inbox = self._inbox, []
                        if not commands and not s.has_work():
                            self._thread = None
                            return
                    for command in commands:
                        command(s)
                    try:
                        if s.has_work():
                            s.step()
                    except BaseException as exc:  # a scheduler bug: fail everything, keep the cache sane
                        for r in [*s.waiting, *s.prefilling, *s.decoding]:
                            try:
                                s._fail(r, exc)
                            except BaseException:
                                s._remove(r)
                                r.error = exc
                                s.finished.append(r)
                    self._deliver(s.drain())
        except BaseException as exc:  # the loop itself broke: nobody may wait forever
            with self._cv:
                self._thread = None
            for handle in list(self._handles.values()):
                dequeued(handle.request)
                if not handle.future.done():
                    handle.future.set_exception(exc)
            self._handles.clear()
            raise

    def _deliver(self, done: list[Request]) -> None:
        recorder = self.recorder
        if recorder is not None and done:  # before the results: a caller that saw its result finds its line handed over
            s = self.scheduler
            recorder.left(done, earliest_arrival((s.waiting, s.prefilling, s.decoding)))
        for req in done:
            handle = self._handles.pop(req.rid, None)
            # A future is already done when its waiter cancelled it (an asyncio task awaiting it through
            # `wrap_future` was cancelled): nobody wants the result, and setting it would raise here and
            # kill the loop thread.
            if handle is None or handle.future.done():
                continue
            if req.error is not None:
                handle.future.set_exception(req.error)
                continue
            try:
                handle.future.set_result(self._finish(req))
            except BaseException as exc:
                handle.future.set_exception(exc)
