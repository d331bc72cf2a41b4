"""One pass and what follows it: the layer of `Scheduler` (engine.scheduler) that runs a step's forward pass.

`_run` runs the decodes and chunks through the ModelRunner (a staged chunk's deferred disk load copied up to the
layers it runs first), commits what the pass computed (in flight: `share_in_flight`), starts the decodes of
finished prefills, and samples and emits every row (grammar masks first, one argmax for the plain-greedy rows).

Invariants: a pass that raises an Exception commits nothing and moves no request, and is retried once for each of
its requests alone (one whose own pass fails again fails with that error); KeyboardInterrupt and the like fail
every request of the pass at once. Each request's commit, sampling, output stages and release run in a guard: an
exception fails that request alone. A finished request is released (kv.manager's `release`) before it leaves.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from radixcache.runtime.engine.output import OutputProcessor, pass_tokens
from radixcache.runtime.engine.request import Request
from radixcache.runtime.engine.runner import ModelRunner
from radixcache.runtime.engine.scheduler_config import SchedulerConfig
from radixcache.runtime.engine.scheduler_queues import SchedulerQueues


class PassRun(SchedulerQueues):
    """`_run`: one forward pass over a step's decodes and chunks, then its commits and emitted tokens."""

    runner: ModelRunner  # (set in Scheduler.__init__)
    output: OutputProcessor
    config: SchedulerConfig

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

    def _emit_all(self, done: list[tuple[Request, torch.Tensor]], greedy: Mapping[int, int | None]) -> None:
        """Sample every row (grammar masks first); plain-greedy rows take one argmax for the pass, or the native
        head's token (`greedy`, by id of request) where no grammar changed the row (output.pass_tokens)."""
        done = self.output.constrain(done, self._fail)  # grammar masks on constrained rows (engine.structured)
        for (r, row), token in zip(done, pass_tokens(done, greedy), strict=True):
            self._emit(r, row, token)

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
