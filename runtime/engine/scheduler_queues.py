"""The scheduler's queues and the ways a request leaves them: the base layer of `Scheduler` (engine.scheduler).

`SchedulerQueues` holds the moves every other layer makes: prefilling to decoding (`_start_decoding`, which pins a
pinned prompt once whole, and leaves a request prefilling whose deferred disk load failed as it was to start), out
of every queue (`_remove`), and out of the scheduler (`_leave`, through `_fail`, `_end_outgrown` or an abort), with
a streaming caller told (`_notify`) and one request's stage run in a guard (`_guard`).

Invariants: a request is in at most one of `waiting`, `prefilling` and `decoding`; it enters `finished` once only
(`_leave` is a no-op for one that already left), holding no block (kv.manager's `abort`, `release` or `preempt` ran
first); a failure in one request's stage fails that request alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from radixcache.runtime.engine.request import Request, dequeued
from radixcache.runtime.kv.manager import KVManager
from radixcache.runtime.kv.state import Status


class SchedulerQueues:
    """A request's moves between the queues, and its exits (set up in Scheduler.__init__)."""

    kv: KVManager
    waiting: list[Request]
    prefilling: list[Request]
    decoding: list[Request]
    finished: list[Request]  # left this step (done, aborted, failed): the owner drains it

    @property
    def running(self) -> list[Request]:
        return self.prefilling + self.decoding

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def _start_decoding(self, req: Request) -> None:
        # A resumed request all of whose positions were loaded: every layer now. A copy that raised took its disk
        # pages' positions away (a failed read): it stays prefilling and computes them first (it decoded without
        # them, its output wrong, until 2026-12-07).
        if not self.kv.load_layers(req.kv):
            return
        self.prefilling.remove(req)
        self.decoding.append(req)
        if req.pin and not req.pinned_tokens:
            req.pinned_tokens = self.kv.pin(req.kv, req.all_ids, req.pin_for)

    def _guard(self, req: Request, stage: Callable[..., object], *args: object) -> bool:
        """Run one request's stage; an exception fails that request alone (its blocks freed, its lock dropped) and
        returns False."""
        try:
            stage(*args)
        except BaseException as exc:
            self._fail(req, exc)
            return False
        return True

    def _end_outgrown(self, req: Request) -> None:
        """A request that outgrew the pool ends as if it reached its length limit, with every token it made; its
        computed KV goes to the tree like any finished request's."""
        self._remove(req)
        if req.kv.status is Status.RUNNING:
            if not self._guard(req, self.kv.release, req.kv, req.all_ids, len(req.output_ids)):
                return
        else:  # preempted and waiting: it holds nothing, and ends FINISHED as every released request does
            req.kv.status = Status.FINISHED
        req.finish_reason = "length"
        self._leave(req)

    def _remove(self, req: Request) -> bool:
        req.staged = None  # a chunk between passes is dropped: its positions were never counted computed
        for queue in (self.waiting, self.prefilling, self.decoding):
            if req in queue:
                queue.remove(req)
                return True
        return False

    def _fail_pass(self, decodes: list[Request], chunks: list[tuple[Request, int]], exc: BaseException) -> None:
        for r in [*decodes, *(r for r, _ in chunks)]:
            self._fail(r, exc)

    def _fail(self, req: Request, exc: BaseException) -> None:
        """End `req` with `exc`, in any state: free what it holds, drop its lock (kv.abort). A request that already
        left keeps its place in `finished` and takes the error."""
        self._remove(req)
        self.kv.abort(req.kv, req.all_ids)  # its run is refreshed in the tiers (hashed off the loop)
        req.error = exc
        self._leave(req)

    def _leave(self, req: Request) -> None:
        if req.t_finish is not None:  # it already left (a stage after its release failed): once only
            return
        dequeued(req)  # a no-op for a request that was admitted
        if self.kv.tiers is not None:  # one that leaves without admission (outgrown) holds no prefetch
            self.kv.tiers.cancel_prefetch(req.kv.rid)
        req.t_finish = time.perf_counter()
        self.finished.append(req)
        self._notify(req)

    def _notify(self, req: Request) -> None:
        """Tell a streaming caller about new tokens. A listener that raises (a caller that went away: a closed event
        loop) is dropped, and its request fails with that error, alone."""
        if req.listener is None:
            return
        try:
            req.listener(req)
        except BaseException as exc:
            req.listener = None
            if req.t_finish is None:
                self._fail(req, exc)
            elif req.error is None:
                req.error = exc
