"""The model runner: turns the scheduler's choice for a step into one forward pass over the paged pool.

It owns the model, the KV pool and the decode mirror. `step` takes the running decodes and the prefill chunks the
scheduler picked, runs them in one pass (model.batch: `[decodes | chunk 0 | chunk 1 | ...]`), and advances each
request's `kv.num_kv` only once the pass has returned, so a pass that raises leaves every request where it was.
A request with a `staged` chunk (engine.prefill_budget.StagedChunk) runs its layers `[next_layer, stop)`; its
positions count once its last layer has run, and until then its rows wait in `staged.hidden`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from radixcache.runtime.engine.request import Request
from radixcache.runtime.kv.mirror import DecodeMirror
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.batch import DecodeBatch, ForwardLogits, PrefillChunk
from radixcache.runtime.model.llama import LlamaModel


class ModelRunner:
    """One forward pass per engine step. `mirror`: the decode mirror (kv.mirror), or None for the paged paths."""

    def __init__(self, model: LlamaModel, pool: KVPool, mirror: DecodeMirror | None = None) -> None:
        self.model = model
        self.pool = pool
        self.mirror = mirror
        self.passes = 0  # forward passes run (for tests and metrics)
        self.prefill_positions = 0  # prompt positions computed (recomputation after preemption included)
        # a decode-only pass's native team (DecodeBatch.team), set by the engine loop before each step (threads.py)
        self.team_threads = 0

    def team_decode(self, rows: int) -> bool:
        """Whether a decode-only pass of `rows` rows runs on the native layers' team without barriers
        (runtime/native/decode_team.c), which loses nothing to a thread the machine deschedules."""
        layers = getattr(self.model, "native_layers", None)
        return self.mirror is not None and layers is not None and layers.team_takes(rows)

    def step(self, decodes: Sequence[Request], chunks: Sequence[tuple[Request, int]]) -> ForwardLogits:
        """Decode one token for each of `decodes` (their pages must cover it) and compute the next `n` prompt
        positions of each `(request, n)` in `chunks` (their pages were allocated at admission). A decode-only pass
        the native layers take without barriers runs on `team_threads` threads (DecodeBatch.team)."""
        decode = None
        mirror_step = None
        if decodes:
            tables = [r.kv.block_table for r in decodes]
            lengths = [r.kv.num_kv + 1 for r in decodes]
            meta = build_decode_meta(tables, lengths, self.pool.page_size, self.model.device)
            if self.mirror is not None:  # a request that was preempted comes back with new KV: a new key
                keys = [(r.rid, r.kv.preemptions) for r in decodes]
                mirror_step = self.mirror.prepare(keys, tables, lengths, self.pool)
            decode = DecodeBatch([r.output_ids[-1] for r in decodes], meta, mirror_step, self.team_threads)
        parts = []
        for r, n in chunks:
            start = r.kv.num_kv
            st = r.staged
            layers = None if st is None else (st.next_layer, st.stop)
            hidden = None if st is None else st.hidden
            parts.append(PrefillChunk(r.all_ids[start : start + n], start, r.kv.block_table, layers, hidden))
        out = self.model.forward(self.pool, decode=decode, chunks=parts)
        self.passes += 1
        if mirror_step is not None:
            assert self.mirror is not None
            self.mirror.commit(mirror_step)
        for r in decodes:
            r.kv.num_kv += 1
        for i, (r, n) in enumerate(chunks):
            rows = out.hidden[i] if out.hidden else None
            if rows is not None:  # a staged chunk stopped before the last layer: it goes on next pass
                assert r.staged is not None
                r.staged = replace(r.staged, next_layer=r.staged.stop, hidden=rows)
                continue
            r.staged = None
            r.kv.num_kv += n
            self.prefill_positions += n
        return out
