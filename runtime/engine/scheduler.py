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
from collections.abc import Callable, Mapping
from dataclasses import replace

import torch

from radixcache import CacheFullError
from radixcache.runtime.engine.errors import QueueTimeoutError, RequestTooLargeError
from radixcache.runtime.engine.output import OutputProcessor, pass_tokens
from radixcache.runtime.engine.prefill_budget import StepBudget
from radixcache.runtime.engine.request import Request, dequeued
from radixcache.runtime.engine.runner import ModelRunner
from radixcache.runtime.engine.schedule_order import admission_order, must_wait_for_sharer
from radixcache.runtime.engine.scheduler_config import SCHEDULES, SchedulerConfig
from radixcache.runtime.kv.manager import KVManager
from radixcache.runtime.kv.state import Status

__all__ = ["SCHEDULES", "Scheduler", "SchedulerConfig"]


class Scheduler:
    """Waiting, prefilling and decoding requests of one engine; `step()` advances them all by one pass."""

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

    @property
    def running(self) -> list[Request]:
        return self.prefilling + self.decoding

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

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

    def drain(self) -> list[Request]:
        out, self.finished = self.finished, []
        return out

    # ------------------------------------------------------------------ one pass

    def _run(self, decodes: list[Request], chunks: list[tuple[Request, int]], retry: bool = True) -> None:
        t0 = time.perf_counter()
        try:
            chunks = self._load_layers(chunks)
            if not decodes and not chunks:
                return
            staged = any(r.staged for r, _ in chunks)
            logits = self.runner.step(decodes, chunks)
        except Exception as exc:  # nothing was committed, no request moved: retry each once, alone
            if not retry:
                return self._fail_pass(decodes, chunks, exc)
            for r in decodes:  # a fault of one request's pass fails only that request
                if r in self.decoding:
                    self._run([r], [], retry=False)
            for r, n in chunks:
                if r in self.prefilling:
                    self._run([], [(r, n)], retry=False)
            return
        except BaseException as exc:  # KeyboardInterrupt and the like: no retry
            return self._fail_pass(decodes, chunks, exc)
        if chunks and not staged and self.kv.tiers is not None:  # what a page load competes with: prefill a token
            self.kv.tiers.note_prefill(sum(n for _, n in chunks) + len(decodes), time.perf_counter() - t0)
        share = self.config.share_in_flight
        p = self.kv.page_size
        done: list[tuple[Request, torch.Tensor]] = []  # (request, logits row): each gets its next token now
        best = logits.decode_best  # id(request) -> its row's argmax, where the pass found it
        greedy = {id(r): b for r, b in zip(decodes, best, strict=True)} if best is not None else {}
        for i, r in enumerate(decodes):
            if share and r.kv.num_kv % p == 0 and not self._guard(r, self.kv.commit, r.kv, r.all_ids):
                continue  # the pass filled a page, and committing it failed: that request alone
            assert logits.decode is not None
            done.append((r, logits.decode[i]))
        ran = [r for r, _ in chunks if r.staged is None]  # a staged one between passes computed nothing yet
        for i, r in enumerate(ran):  # logits rows: the chunks that ran their last layer
            if self._guard(r, self._after_chunk, r) and not r.output_ids and r in self.decoding:
                assert logits.chunks is not None  # fresh: its first token (a resumed one has its next input)
                done.append((r, logits.chunks[i]))
        self._emit_all(done, greedy)

    def _load_layers(self, chunks: list[tuple[Request, int]]) -> list[tuple[Request, int]]:
        """Copy each chunk's deferred disk load up to the layers this pass runs (kv.tier.layered_load); the chunks
        that can run. One whose copy failed sits this pass out: its disk pages are recomputed from the next."""
        runnable = []
        for r, n in chunks:
            if self.kv.load_layers(r.kv, r.staged.stop if r.staged else None):
                runnable.append((r, n))
            else:
                r.staged = None  # layers run over positions it no longer has: its positions were never counted
        return runnable

    def _after_chunk(self, req: Request) -> None:
        """Commit what a prefill chunk computed (in flight, or a pinned prompt's once whole); start decoding."""
        finished_prefill = req.kv.num_kv >= req.prefill_end
        if self.config.share_in_flight or (finished_prefill and req.pin):
            self.kv.commit(req.kv, req.all_ids)
        if finished_prefill:
            self._start_decoding(req)

    def _guard(self, req: Request, stage: Callable[..., object], *args: object) -> bool:
        """Run one request's stage; an exception fails that request alone (its blocks freed, its lock dropped) and
        returns False."""
        try:
            stage(*args)
        except BaseException as exc:
            self._fail(req, exc)
            return False
        return True

    def _emit_all(self, done: list[tuple[Request, torch.Tensor]], greedy: Mapping[int, int | None]) -> None:
        """Sample every row (grammar masks first); plain-greedy rows take one argmax for the pass, or the native
        head's token (`greedy`, by id of request) where no grammar changed the row (output.pass_tokens)."""
        done = self.output.constrain(done, self._fail)  # grammar masks on constrained rows (engine.structured)
        for (r, row), token in zip(done, pass_tokens(done, greedy), strict=True):
            self._emit(r, row, token)

    def _start_decoding(self, req: Request) -> None:
        self.kv.load_layers(req.kv)  # a resumed request all of whose positions were loaded: every layer now
        self.prefilling.remove(req)
        self.decoding.append(req)
        if req.pin and not req.pinned_tokens:
            req.pinned_tokens = self.kv.pin(req.kv, req.all_ids, req.pin_for)

    def _emit(self, req: Request, logits: torch.Tensor, token: int | None = None) -> None:
        """Sample (penalties, logprobs, stop strings, detokenising), then release a finished request or tell its
        listener; any of these raising fails `req` alone."""
        try:
            self.output.emit(req, logits, token)
            if req.finished:
                self._remove(req)
                self.kv.release(req.kv, req.all_ids, len(req.output_ids))
                self._leave(req)
                return
        except BaseException as exc:
            self._fail(req, exc)
            return
        self._notify(req)

    # ------------------------------------------------------------------ decode

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

    def _end_outgrown(self, req: Request) -> None:
        """A request that outgrew the pool ends as if it reached its length limit, with every token it made; its
        computed KV goes to the tree like any finished request's."""
        self._remove(req)
        if req.kv.status is Status.RUNNING and not self._guard(
            req, self.kv.release, req.kv, req.all_ids, len(req.output_ids)
        ):
            return
        req.finish_reason = "length"
        self._leave(req)

    def _preempt(self, req: Request) -> None:
        self._remove(req)
        if not self._guard(req, self.kv.preempt, req.kv, req.all_ids):  # it failed alone, holding nothing
            return
        req.wait_steps = 0
        self.preemptions += 1
        self.waiting.append(req)

    # ------------------------------------------------------------------ prefill and admission

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

    # ------------------------------------------------------------------ order

    # ------------------------------------------------------------------ leaving

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
