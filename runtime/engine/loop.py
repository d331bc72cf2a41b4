"""The engine loop: one thread owns the scheduler (and so the cache and the KV pool); callers on any thread
submit requests and wait on futures.

The thread starts when work arrives and ends when there is none left, so an idle engine holds no thread.
Results and errors travel back through `concurrent.futures.Future` (wrap it with `asyncio.wrap_future` to
await it); streaming callers get each new token through the request's listener, called on the loop thread.

Faults: every future is completed with `settle`, which ignores a future its caller cancelled meanwhile (a cancel
can land between any check and the set); cancelling a handle's future aborts its request (its blocks are freed at
the next step). A command that raises fails its own future; a step that raises outside the scheduler's per-request
guards (a scheduler bug) fails every request in flight with that error and the loop goes on; delivering one result
that raises fails that result alone; a caller's done-callback that raises (they run on the loop thread, in the set)
is logged, whatever it raises. If the thread dies anyway (a bug in the loop itself), every request in flight
and every later call gets EngineDeadError naming the original error, instead of waiting forever.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

import torch

from radixcache.runtime.engine.errors import EngineClosedError, EngineDeadError
from radixcache.runtime.engine.request import GenerationResult, Request, dequeued
from radixcache.runtime.engine.scheduler import Scheduler
from radixcache.runtime.engine.threads import PROBE_PREFILL_TOKENS, ThreadController
from radixcache.runtime.engine.trace_recorder import TraceRecorder, earliest_arrival
from radixcache.runtime.kv.tier.disk_writer import wait_bound
from radixcache.runtime.native.openmp import release_idle_team

_UNSET: Any = object()

log = logging.getLogger("radixcache.engine")


def settle(future: Future[Any], result: Any = _UNSET, error: BaseException | None = None) -> bool:
    """Complete `future` with `result` or `error`, unless it is already done (a caller that cancelled it, even
    between a check and this set): True if this call completed it. The caller's done-callbacks run in the set, on
    this thread (the loop's); a RequestHandle's future logs whatever one of them raises (GuardedFuture)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        return False
    return True


class GuardedFuture(Future):
    """A Future whose done-callbacks cannot raise out of its completion. concurrent.futures logs a callback's
    Exception and runs the next; one that raised past it (SystemExit, KeyboardInterrupt, any BaseException: sys.exit()
    in an agent's last-step hook) ended the set there: on the loop thread it killed the loop, failing every request
    in flight and every later call with EngineDeadError, and the callbacks after it (an asyncio waiter, the server's
    wake-up) never ran, leaving their callers waiting for ever. Each is logged, and the rest run."""

    def add_done_callback(self, fn: Callable[[Future[Any]], object]) -> None:
        super().add_done_callback(functools.partial(_guarded, fn))


def _guarded(fn: Callable[[Future[Any]], object], future: Future[Any]) -> None:
    try:
        fn(future)
    except BaseException:
        log.exception("a done-callback of an engine future raised; the future is completed, the loop goes on")


class RequestHandle:
    """A submitted request: wait for its result, or cancel it at any moment."""

    def __init__(self, loop: EngineLoop, req: Request) -> None:
        self.request = req
        self.future: Future[GenerationResult] = GuardedFuture()
        self._loop = loop
        # The callback holds the loop and the request, not this handle: the future keeps its callbacks after it
        # completes, and a handle <-> future cycle would keep the loop (its scheduler, KV pool and model) alive
        # until a full collection, long after the engine is dropped.
        self.future.add_done_callback(functools.partial(_abort_if_cancelled, loop, req))

    @property
    def rid(self) -> int:
        return self.request.rid

    def result(self, timeout: float | None = None) -> GenerationResult:
        """The request's result, waiting at most `timeout` seconds (None: for ever); a ValueError for a timeout that
        is no number >= 0 (NaN was a bare TimeoutError at once, "5" a TypeError from inside the wait), a RuntimeError
        on the engine loop's own thread while it is pending (the wait would never end)."""
        timeout = wait_bound(timeout)
        if not self.future.done():
            self._loop.refuse_wait_on_loop()
        return self.future.result(timeout)

    def done(self) -> bool:
        return self.future.done()

    def cancel(self) -> None:
        """Abort the request (its blocks are freed at the next step); its result has finish_reason "cancelled"."""
        _abort(self._loop, self.request)


def _abort(loop: EngineLoop, req: Request) -> None:
    loop.call(lambda s: s.abort(req, "cancelled"))


def _abort_if_cancelled(loop: EngineLoop, req: Request, future: Future[GenerationResult]) -> None:
    """A caller cancelled the future (an asyncio waiter through `wrap_future`): nobody wants the result, so the
    request is aborted and its blocks freed (a no-op if it already left)."""
    if future.cancelled() and loop.dead is None:
        with contextlib.suppress(EngineDeadError):  # the loop died meanwhile: nothing left to abort
            _abort(loop, req)


class EngineLoop:
    """Runs `scheduler.step()` on its own thread while there is work; applies commands between steps. `threads`
    (runtime.engine.threads) sets the torch thread count of each step, changed only between steps; None leaves
    the thread's default."""

    def __init__(
        self,
        scheduler: Scheduler,
        finish: Callable[[Request], GenerationResult],
        threads: ThreadController | None = None,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.threads = threads
        self.on_idle = on_idle  # called on the loop thread each time it runs out of work, before it exits
        self._finish = finish
        self._cv = threading.Condition()
        self._inbox: list[Callable[[Scheduler], Any]] = []
        self._posted: deque[Callable[[Scheduler], Any]] = deque()  # `post`'s: appended without a lock
        self._handles: dict[int, RequestHandle] = {}
        self._thread: threading.Thread | None = None
        self._dead: EngineDeadError | None = None
        self._refusing = False  # closed to new requests (Engine.close); commands still run
        self.beat = time.monotonic()  # the loop thread's start or last turn (steps, commands): its progress, to a check
        self.recorder: TraceRecorder | None = None  # sees every request that leaves (Engine.record_trace)

    def submit(self, req: Request) -> RequestHandle:
        return self.submit_many([req])[0]

    def submit_many(
        self, reqs: list[Request], prepare: Callable[[Scheduler], None] | None = None
    ) -> list[RequestHandle]:
        """Queue requests without waiting: they reach the scheduler together, between two steps. `prepare` runs on
        the loop thread just before they are added (to read the cache's state at that moment)."""
        self.check_alive()
        handles = [RequestHandle(self, r) for r in reqs]

        def add_all(s: Scheduler) -> None:
            error = None
            if prepare is not None:
                try:
                    prepare(s)
                except BaseException as exc:
                    error = exc
            for handle in handles:  # each settled or queued, whatever raises
                try:
                    if error is not None:
                        raise error
                    if handle.future.cancelled():  # cancelled before it reached the loop: never queued
                        dequeued(handle.request)
                        continue
                    s.add(handle.request)
                except BaseException as exc:
                    with contextlib.suppress(BaseException):
                        dequeued(handle.request)
                    settle(handle.future, error=exc)
                    continue
                self._handles[handle.rid] = handle

        try:
            self.call(add_all, submission=True)
        except BaseException:  # refused (closed, or the loop died meanwhile): they leave the admission queue
            for r in reqs:
                dequeued(r)
            raise
        return handles

    @property
    def dead(self) -> EngineDeadError | None:
        """EngineDeadError once the loop thread has died (a bug), else None."""
        return self._dead

    def check_alive(self) -> None:
        """Raise EngineDeadError (naming the original error) if the loop thread has died."""
        if self._dead is not None:
            raise EngineDeadError(self._dead.cause)

    def refuse_submissions(self) -> None:
        """Take no new request from now on (EngineClosedError): one whose submission is already queued runs before
        any command queued after this call (the inbox is in order), so a close's cancel reaches it."""
        with self._cv:
            self._refusing = True

    def call(self, fn: Callable[[Scheduler], Any], *, submission: bool = False) -> Future[Any]:
        """Run `fn(scheduler)` on the loop thread between steps; its return value comes back in the future.
        Raises EngineDeadError once the loop thread has died, and EngineClosedError for a `submission` (new
        requests) once `refuse_submissions` was called: checked under the lock that queues it."""
        fut: Future[Any] = Future()

        def run(s: Scheduler) -> None:
            try:
                result = fn(s)
            except BaseException as exc:
                settle(fut, error=exc)
            else:
                settle(fut, result)

        with self._cv:
            self.check_alive()
            if submission and self._refusing:
                raise EngineClosedError("this engine is closed")
            self._inbox.append(run)
            if self._thread is None:
                self.beat = time.monotonic()
                self._thread = threading.Thread(target=self._run, name="radixcache-engine", daemon=True)
                self._thread.start()
            self._cv.notify()
            on_loop = threading.current_thread() is self._thread
        if not on_loop:  # the caller is about to wait: its idle OpenMP team would throttle the loop (native.openmp)
            release_idle_team()
        return fut

    def post(self, fn: Callable[[Scheduler], Any]) -> None:
        """Run `fn(scheduler)` on the loop thread before its next step or command, its result and errors dropped (an
        error is logged). It only appends to a deque: no lock, no wait, no thread started, so a finalizer may call it
        on any thread, the loop's own mid-step included. An idle loop runs it when the next call or request wakes it."""
        self._posted.append(fn)

    def wait_for(self, fn: Callable[[Scheduler], Any], timeout: float | None = None) -> Any:
        """`call(fn)` and wait for its value (RuntimeError on the loop thread itself, where it would never end)."""
        self.refuse_wait_on_loop()
        return self.call(fn).result(timeout)

    def refuse_wait_on_loop(self) -> None:
        """Raise RuntimeError on the loop thread itself (where a request future's done-callbacks run): a wait for
        the loop there would never end, and hang every request with it."""
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "waiting for the engine on the engine loop's own thread (a request future's done-callback runs "
                "there) would never end: submit() from there, and wait on another thread"
            )

    def stop(self, timeout: float | None = None) -> bool:
        """Refuse new requests, cancel those in flight (their results say "cancelled") and wait at most `timeout`
        seconds for the thread to exit (False if it had not: a step still running)."""
        self.refuse_submissions()  # a caller still building its request is refused
        if not self.idle():
            self.call(lambda s: s.abort_all("cancelled"))
        return self.wait_idle(timeout)

    def idle(self) -> bool:
        with self._cv:
            return self._thread is None

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is in flight and the loop thread has exited. Returns False on timeout, and at once on
        the loop thread itself (it cannot exit while it waits)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cv:
                thread = self._thread
            if thread is None:
                return True
            if thread is threading.current_thread() or (deadline is not None and time.monotonic() >= deadline):
                return False
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
            with self._cv:  # a thread clears `_thread` before it ends: one that did not never will (os.fork)
                if self._thread is thread:
                    return False

    def after_fork_in_child(self) -> None:
        """In a child of `os.fork` (engine.exit_hook calls it): no loop thread runs here, and a lock a parent's thread
        held stays held. A loop that ran in the parent left its scheduler mid-work, for callers in the parent: the
        engine is dead here (EngineDeadError on every call; `close()` returns at once). An idle one stays usable."""
        self._cv = threading.Condition()
        if self._thread is not None:
            self._dead = EngineDeadError(RuntimeError("this engine was inherited by os.fork as its loop thread ran"))
            self._thread, self._inbox, self._handles = None, [], {}

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        s, ctl = self.scheduler, self.threads
        applied = 0  # the count set on this thread: OpenMP's is per thread, and a new one has the default
        try:
            if ctl is not None:  # inside the guard: a count torch refuses kills the loop, never leaves it hung
                torch.set_num_threads(applied := ctl.threads)
            with torch.inference_mode():
                idled = False  # on_idle ran since the last work: the next time nothing is left, the thread exits
                while True:
                    self.beat = time.monotonic()
                    with self._cv:
                        commands, self._inbox = self._inbox, []
                        out_of_work = not commands and not self._posted and not s.has_work()
                        if out_of_work and (idled or self.on_idle is None):
                            self._thread = None
                            if ctl is not None:
                                ctl.pause()
                            return
                    if out_of_work:
                        idled = True
                        self._idle_hook()
                        continue  # work that arrived meanwhile runs on this thread
                    idled = False
                    self._run_posted()  # after taking the commands: what was posted before one runs before it
                    for command in commands:
                        command(s)  # `call` wraps each: its error goes to its own future
                    try:
                        if s.has_work():
                            if ctl is not None:
                                n, s.runner.team_threads = ctl.begin_step(wide=s.team_decode_next())
                                if n != applied:
                                    torch.set_num_threads(n)  # between steps: never inside a forward pass
                                    applied = n
                            s.prefill_cap = PROBE_PREFILL_TOKENS if ctl is not None and ctl.measuring else None
                            s.step()
                            if ctl is not None:
                                ctl.end_step()
                    except BaseException as exc:  # a scheduler bug outside its per-request guards
                        self._fail_in_flight(exc)
                    self._deliver(s.drain())
        except BaseException as exc:  # the loop itself broke (a bug): nobody may wait forever, nor call again
            self._die(exc)
            raise  # reported by threading.excepthook: a bug to see

    def _run_posted(self) -> None:
        while self._posted:
            try:
                self._posted.popleft()(self.scheduler)
            except BaseException:
                log.exception("a call posted to the engine loop failed; the loop goes on")

    def _idle_hook(self) -> None:
        """`on_idle`, whose error is logged, never the loop's."""
        try:
            self.on_idle()  # type: ignore[misc]
        except Exception:
            log.exception("the engine's idle hook failed")

    def _fail_in_flight(self, exc: BaseException) -> None:
        """Fail every request in flight with `exc`, freeing what each holds, so that the cache stays sane: those in
        the scheduler's queues and any the loop knows of that left them without finishing (mid-step)."""
        s = self.scheduler
        queued = [*s.waiting, *s.prefilling, *s.decoding]
        stray = [h.request for h in self._handles.values() if h.request.t_finish is None and h.request not in queued]
        for r in [*queued, *stray]:
            try:
                s._fail(r, exc)
            except BaseException:
                s._remove(r)
                r.error = exc
                if r.t_finish is None:
                    r.t_finish = time.perf_counter()
                    s.finished.append(r)

    def _die(self, exc: BaseException) -> None:
        """The thread is dying: record why, free what the requests in flight hold if the scheduler still can, and
        fail every waiting future with EngineDeadError."""
        dead = EngineDeadError(exc)
        with contextlib.suppress(BaseException):
            self._fail_in_flight(dead)
            self.scheduler.drain()
        with self._cv:
            self._dead = dead
            self._thread = None
            inbox, self._inbox = self._inbox, []
            self._cv.notify_all()
        for handle in list(self._handles.values()):
            dequeued(handle.request)
            settle(handle.future, error=dead)
        self._handles.clear()
        for command in inbox:  # each `call` future still waiting: fail it through its own wrapper
            with contextlib.suppress(BaseException):
                command(_DeadScheduler(dead))  # type: ignore[arg-type]

    def _deliver(self, done: list[Request]) -> None:
        recorder = self.recorder
        if recorder is not None and done:  # before the results: a caller that saw its result finds its line handed over
            s = self.scheduler
            with contextlib.suppress(Exception):  # a recording never fails a request (trace_recorder warns, stops)
                recorder.left(done, earliest_arrival((s.waiting, s.prefilling, s.decoding)))
        for req in done:
            handle = self._handles.pop(req.rid, None)
            if handle is None or handle.future.done():  # cancelled by its caller: nobody wants it (not counted)
                continue
            if req.error is not None:
                settle(handle.future, error=req.error)
                continue
            try:
                result = self._finish(req)
            except BaseException as exc:  # building this result failed: this request alone
                settle(handle.future, error=exc)
            else:
                settle(handle.future, result)  # a future its caller cancelled meanwhile is left as it is


class _DeadScheduler:
    """What a command queued on a dead loop runs against: any use raises the loop's EngineDeadError."""

    def __init__(self, dead: EngineDeadError) -> None:
        self._dead = dead

    def __getattr__(self, name: str) -> Any:
        raise self._dead
