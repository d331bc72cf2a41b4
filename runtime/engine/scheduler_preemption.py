"""Decodes and preemption: the layer of `Scheduler` (engine.scheduler) that finds each decode its next page.

Every decoding request that has, or can get, a page for its next token runs this pass (`_schedule_decodes`, the
highest priority first). When no page can be had, the lowest-priority running request (newest first) is preempted
(`_preempt`: its computed KV into the tree, its blocks released, back to `waiting` to resume from the cache); a
request that is itself the only one left ends with finish_reason "length" and every token it made
(`SchedulerQueues._end_outgrown`). An allocator failure other than a full pool fails that request alone.
"""

from __future__ import annotations

from radixcache import CacheFullError
from radixcache.runtime.engine.request import Request
from radixcache.runtime.engine.scheduler_queues import SchedulerQueues
from radixcache.runtime.kv.state import Status


class Preemption(SchedulerQueues):
    """`_schedule_decodes`: the decodes of a pass, each with a page for its next token, preempting for it."""

    preemptions: int  # requests preempted so far (set in Scheduler.__init__)

    def _schedule_decodes(self) -> list[Request]:
        """Every decoding request that has (or could get) a page for its next token."""
        batch = []
        for r in sorted(self.decoding, key=lambda r: (-r.priority, r.rid)):  # the important secure pages first
            if r.kv.status is Status.RUNNING and r in self.decoding and self._grow(r):
                batch.append(r)
        return [r for r in batch if r.kv.status is Status.RUNNING and r in self.decoding]

    def _grow(self, req: Request) -> bool:
        """Make sure `req` has a page for its next token, preempting lower-priority requests if needed."""
        while True:
            try:
                self.kv.reserve(req.kv, req.kv.num_kv + 1)
                return True
            except CacheFullError:
                pass
            except BaseException as exc:  # the allocator failed otherwise: this request alone
                self._fail(req, exc)
                return False
            victim = min(self.running, key=lambda r: (r.priority, -r.rid))
            if victim is req:
                if len(self.running) == 1:  # alone and still no page: the pool is full of it (and pins)
                    self._end_outgrown(req)
                else:
                    self._preempt(req)
                return False
            self._preempt(victim)

    def _preempt(self, req: Request) -> None:
        self._remove(req)
        if not self._guard(req, self.kv.preempt, req.kv, req.all_ids):  # it failed alone, holding nothing
            return
        req.wait_steps = 0
        self.preemptions += 1
        self.waiting.append(req)
