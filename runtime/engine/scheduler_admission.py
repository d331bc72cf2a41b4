"""Prefill chunks and admission: the layer of `Scheduler` (engine.scheduler) that plans a pass's prompt work.

`_schedule_prefill` fills a step's `StepBudget` (engine.prefill_budget): a staged chunk goes on alone; else the
requests already prefilling first, then waiting ones in admission order (engine.schedule_order), each admitted
through kv.manager's `admit` (match, lock, allocate, keeping one page of headroom per running decode) and given
its first chunk. A waiting request may wait for a sharer's pages or for its own disk pages (the prefetch policy).

Invariants: at most `max_prefill_seqs` chunks and `max_running` running requests; a request that can never fit
(nothing else running holds memory) fails with CacheFullError, or, preempted with tokens of its own, ends as
outgrown; an admission that raises fails that request alone, holding nothing.
"""

from __future__ import annotations

from dataclasses import replace

from radixcache import CacheFullError
from radixcache.runtime.engine.prefill_budget import StepBudget
from radixcache.runtime.engine.request import Request, dequeued
from radixcache.runtime.engine.runner import ModelRunner
from radixcache.runtime.engine.schedule_order import admission_order, must_wait_for_sharer
from radixcache.runtime.engine.scheduler_config import SchedulerConfig
from radixcache.runtime.engine.scheduler_queues import SchedulerQueues


class PrefillAdmission(SchedulerQueues):
    """`_schedule_prefill`: the prefill chunks of a pass, admitting waiting requests within its budget."""

    runner: ModelRunner  # (set in Scheduler.__init__)
    config: SchedulerConfig

    def _chunk(self, req: Request, budget: StepBudget, chunks: list[tuple[Request, int]]) -> int:
        """Add `req`'s chunk of this pass (what it lacks, within `budget`) to `chunks`; its size (0: none)."""
        n = budget.size(req.kv.num_kv, req.prefill_end - req.kv.num_kv, first=not chunks)
        if n > 0:
            req.staged = budget.staging(req.kv.num_kv, n, len(self.runner.model.layers))
            chunks.append((req, n))
            budget.take(req.kv.num_kv, n)
        return n

    def _schedule_prefill(self, budget: StepBudget, now: float) -> list[tuple[Request, int]]:
        """The chunks of this pass: requests already prefilling first, then new admissions, within `budget`."""
        cfg = self.config
        if staged := [r for r in self.prefilling if r.staged is not None]:  # goes on alone: the pass stays bounded
            return [(r, self._next_stage(r, budget)) for r in staged]
        chunks: list[tuple[Request, int]] = []
        for r in self.prefilling:  # one whose next token does not fit what is left goes first next step
            if budget.spent or len(chunks) >= cfg.max_prefill_seqs or self._chunk(r, budget, chunks) <= 0:
                return chunks
        if budget.spent or not self.waiting:
            return chunks
        cached, order = admission_order(self.waiting, self.prefilling, self.kv, cfg, now)
        for r in order:
            if budget.spent or len(chunks) >= cfg.max_prefill_seqs:
                break
            if len(self.prefilling) + len(self.decoding) >= cfg.max_running:
                break
            if must_wait_for_sharer(r, cached.get(r.rid, 0), now, self.prefilling, self.kv, cfg):
                continue  # waits for a sharer's pages
            if not self.kv.prefetch(r.kv, r.all_ids):
                continue  # waits for its own pages from disk (the prefetch policy)
            try:
                # A fresh prompt, or a resumed request's tokens: all but the last may come from the cache.
                defer = bool(self.decoding) and cfg.staged_prefill_attention is not None  # copied as layers run
                admitted = self.kv.admit(
                    r.kv, r.all_ids, r.prefill_end, reserve=len(self.decoding), strict=False, defer=defer
                )
            except BaseException as exc:
                self.waiting.remove(r)
                self._fail(r, exc)
                continue
            if not admitted:
                if not self.prefilling and not self.decoding:  # nothing will ever free memory for it
                    if r.output_ids:  # a preempted request whose own tokens outgrew the pool: keep what it made
                        self._end_outgrown(r)
                        continue
                    self.waiting.remove(r)
                    self._fail(r, CacheFullError(f"request {r.rid} does not fit the KV pool beside pinned blocks"))
                    continue
                break
            self.waiting.remove(r)
            if r.t_admitted is None:
                r.t_admitted = now
                dequeued(r)
            self.prefilling.append(r)
            if r.kv.num_kv >= r.prefill_end:  # a resumed request whose every position is cached: it decodes next
                self._guard(r, self._start_decoding, r)
                continue
            copied = r.kv.tier_pages > 0 and not r.kv.pending_load
            if not (self.decoding and copied):  # beside decodes, a load copied in this step is chunked next step
                self._chunk(r, budget, chunks)  # none: past the step's attention work, it runs among the prefilling
        return chunks

    def _next_stage(self, req: Request, budget: StepBudget) -> int:
        """Set the layers a staged chunk runs this pass (the rest of them once nothing decodes); its tokens."""
        st = req.staged
        assert st is not None
        last = len(self.runner.model.layers)
        req.staged = replace(st, stop=last if budget.stage is None else min(last, st.next_layer + st.per_pass))
        return st.tokens
