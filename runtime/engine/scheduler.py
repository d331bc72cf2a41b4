"""Continuous batching with a cache-aware order: the scheduler that drives the engine's steps.

Each `step()` runs ONE forward pass (engine.runner) over every running decode and the prefill chunks of as many
requests as the step's token budget allows (mixed batches, chunked prefill). Requests join and leave between steps.

- Budget: `max_prefill_tokens` prompt tokens per step while nothing decodes; `mixed_prefill_tokens` while requests
  decode, so that a long prompt arriving costs the running requests a bounded stall per token (chunking); at most
  `max_prefill_seqs` requests' chunks per pass, each at most `prefill_chunk` tokens. `mixed_prefill_attention`
  (off by default) also bounds the attention work of a step's chunks while requests decode (engine.prefill_budget);
  `staged_prefill_attention` runs a chunk over it by layers over several passes (model.staged), as the step's
  only chunk until it is done.
- In-flight sharing (`share_in_flight`): after each pass, every chunk's computed full pages (and every page a decode
  filled) go into the tree, still locked by their request (kv.manager.commit). A request that arrives while another
  computes the same prefix matches whatever pages exist by then.
- Order of admission (`schedule`): `fcfs` (arrival), `lpm` (longest cached prefix first) or `dfs-weight`
  (requests grouped by the cached subtree they hit, heaviest subtree first, so a shared prefix is computed once
  and then hit by the rest). Priority (`Request.priority`) comes before any of these. A starvation guard puts
  any request that has waited `max_wait_steps` steps or `max_wait_s` seconds first, in arrival order.
- In-batch sharing (cache-aware schedules): a waiting request that shares at least one uncached page with a
  request still being prefilled waits (a bounded time: the starvation guard) until those pages are committed,
  then hits them; never for pages past that request's admission limit (kv.manager), which are not committed.
- Prefetch (kv.tier.prefetch): a request's disk pages are read by reader threads from its arrival, paced beside
  decodes; it is admitted when the prefetch policy allows, and chunked a step after a load's copy if others decode.
- Admission is bounded by free + evictable blocks, keeping one page of headroom per running decode. When a
  decode needs a page and none can be evicted, the lowest-priority running request (newest first) is
  preempted: its computed KV goes to the tree, its blocks are released, and it is resumed later from the cache.
  Positions computed again are counted as `recomputed_tokens`, never as hits.
- A request whose prompt needs more pages than the whole pool is refused at `add` (RequestTooLargeError). A
  request that alone cannot grow (every other request preempted) ends with finish_reason "length" and every token
  it generated; nothing deadlocks.
- Queue timeout: a request not admitted by its `queue_deadline` fails with QueueTimeoutError, holding nothing.
- `abort` (cancel or timeout) works in every state. A pass that raises an Exception is retried once for each of its
  requests alone (a request whose own pass fails again fails with that error); KeyboardInterrupt and the like fail
  every request of the pass at once. No other request is touched.
  Every stage that runs for one request (a commit, its pin, its next page, a preemption or release, sampling and
  the output stages, its listener) runs in a guard: an exception fails that request alone (`_guard`, `_emit`).
  Every path leaves `check_invariants()` true and no block held by a request that left.

The scheduler is given what it drives (a ModelRunner, the KVManager, an OutputProcessor) and knows nothing else
of the engine. It is single-threaded: the engine loop thread calls it. Tests may drive it directly, step by step.
"""

from __future__ import annotations

import time

from radixcache.runtime.engine.errors import QueueTimeoutError, RequestTooLargeError
from radixcache.runtime.engine.output import OutputProcessor
from radixcache.runtime.engine.prefill_budget import StepBudget
from radixcache.runtime.engine.request import Request
from radixcache.runtime.engine.runner import ModelRunner
from radixcache.runtime.engine.scheduler_admission import PrefillAdmission
from radixcache.runtime.engine.scheduler_config import SCHEDULES, SchedulerConfig
from radixcache.runtime.engine.scheduler_pass import PassRun
from radixcache.runtime.engine.scheduler_preemption import Preemption
from radixcache.runtime.kv.manager import KVManager

__all__ = ["SCHEDULES", "Scheduler", "SchedulerConfig"]


class Scheduler(PassRun, PrefillAdmission, Preemption):
    """Waiting, prefilling and decoding requests of one engine; `step()` advances them all by one pass.

    Assembled from layers on one object, each in its own module: engine.scheduler_queues (the queues and a
    request's exits, the base of the others), engine.scheduler_preemption (decodes and preemption),
    engine.scheduler_admission (prefill chunks and admission), engine.scheduler_pass (one pass and its output).
    """

    def __init__(
        self,
        runner: ModelRunner,
        kv: KVManager,
        output: OutputProcessor,
        config: SchedulerConfig | None = None,
    ) -> None:
        self.runner = runner
        self.kv = kv
        self.output = output
        self.config = config or SchedulerConfig()
        self.waiting: list[Request] = []
        self.prefilling: list[Request] = []
        self.decoding: list[Request] = []
        self.finished: list[Request] = []  # left this step (done, aborted, failed): the owner drains it
        self.steps = 0
        self.prefill_cap: int | None = None  # prompt tokens a step may take at most, set by the loop (threads.py)
        self.preemptions = 0

    # ------------------------------------------------------------------ public API

    def add(self, req: Request) -> None:
        """Queue a request. Raises RequestTooLargeError, holding nothing, if it can never fit the pool."""
        need = self.kv.pages(len(req.prompt_ids))
        cap = self.kv.cache.capacity_blocks
        if need > cap:
            raise RequestTooLargeError(
                f"a prompt of {len(req.prompt_ids)} tokens needs {need} pages of {self.kv.page_size} tokens, "
                f"but the whole KV pool holds {cap} pages"
            )
        self.kv.mark_retention(req.namespace, req.prompt_ids, req.retention)
        self.kv.prefetch(req.kv, req.all_ids)  # its disk pages start coming in now, off the loop
        self.waiting.append(req)

    def abort(self, req: Request, reason: str = "cancelled") -> bool:
        """Stop a request now, in any state: free what it holds; it finishes with `reason` and its output so
        far. Returns False if it had already left."""
        if not self._remove(req):
            return False
        self.kv.abort(req.kv, req.all_ids)  # its run is refreshed in the tiers (hashed off the loop)
        req.finish_reason = reason
        self._leave(req)
        return True

    def abort_all(self, reason: str) -> None:
        """`abort` every request in flight (Engine.close)."""
        for r in [*self.waiting, *self.prefilling, *self.decoding]:
            self.abort(r, reason)

    def step(self) -> None:
        """One engine step: time out, pick the decodes and the prefill chunks, run them in one pass, emit; at most
        `prefill_cap` prompt tokens when set (by the loop while its thread controller is `measuring`)."""
        self.steps += 1
        self.kv.leases.expire()  # leases past their deadline release their pages (runtime.kv.leases)
        now = time.perf_counter()
        for r in [*self.waiting, *self.prefilling, *self.decoding]:
            if r.deadline is not None and now >= r.deadline:
                self.abort(r, "timeout")
            elif r.queue_deadline is not None and r.t_admitted is None and now >= r.queue_deadline:
                waited = now - r.t_arrival
                self._fail(r, QueueTimeoutError(f"request {r.rid} waited {waited:.1f} s without being admitted"))
        decodes = self._schedule_decodes()
        cfg = self.config
        work, stage = (cfg.mixed_prefill_attention, cfg.staged_prefill_attention) if decodes else (None, None)
        tokens = cfg.mixed_prefill_tokens if decodes else cfg.max_prefill_tokens  # no decodes: nobody stalls
        tokens = tokens if self.prefill_cap is None else min(tokens, max(1, self.prefill_cap))
        budget = StepBudget(tokens, cfg.prefill_chunk, work, stage)
        chunks = self._schedule_prefill(budget, now)
        if self.kv.tiers is not None:  # disk reads beside decodes go at the step's pace; else no busy loop
            self.kv.tiers.pace_prefetch(bool(decodes), wait=0.0 if decodes or chunks or not self.waiting else 0.01)
        if decodes or chunks:
            self._run(decodes, chunks)
        for r in self.waiting:
            r.wait_steps += 1

    def team_decode_next(self) -> bool:
        """Whether the next step is a decode-only pass (nothing waiting or prefilling) of rows the model runs on
        its native layers' team without barriers (ModelRunner.team_decode): the loop gives that team every
        configured thread (`ModelRunner.team_threads`; runtime.engine.threads)."""
        return (
            not self.waiting
            and not self.prefilling
            and bool(self.decoding)
            and self.runner.team_decode(len(self.decoding))
        )

    def drain(self) -> list[Request]:
        out, self.finished = self.finished, []
        return out
