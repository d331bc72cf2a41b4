"""Helpers for the decode mirror tests (radixcache.runtime.kv.mirror, test_mirror_*.py).

`Twin` holds the same sequences in two pools and decodes them through a DecodeMirror in one and by the paged paths
alone in the other, asserting equal logits at every step; `naive_attention` is the float64 reference over K/V read
slot by slot (`read_sequence`); `failing_layer` and `failing_attend` inject a failure mid-forward; `run_together`
and `assert_same_results` compare engines. Imported with `from tests.runtime.engine.mirror_twin import ...`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
from collections.abc import Hashable, Iterator, Sequence
from unittest import mock

import torch

from radixcache.runtime import Engine
from radixcache.runtime.kv.mirror import DecodeMirror, MirrorStep
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.testing import RandomModel, hold_engine_loop, tiny_model

CPU = torch.device("cpu")
PAGE = 16
BLOCKS = 256
TOL = {torch.float32: 2e-6, torch.float64: 1e-12}  # of the logits' scale: max(1, max |logit|)
MODEL = tiny_model(seed=7)  # module level: the hypothesis test cannot take function-scoped fixtures


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def read_sequence(pool: KVPool, layer: int, table: Sequence[int], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions 0 .. n-1 of one sequence, `[n, kv_heads, head_dim]` K and V, read slot by slot."""
    p = pool.page_size
    k_flat = pool.kv[layer, 0].reshape(-1, pool.kv_heads, pool.head_dim)
    v_flat = pool.kv[layer, 1].reshape(-1, pool.kv_heads, pool.head_dim)
    slots = [table[pos // p] * p + pos % p for pos in range(n)]
    return k_flat[slots], v_flat[slots]


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query q `[H, D]` over k, v `[S, KV, D]`, in float64 with the KV heads repeated. Returns `[H, D]`."""
    h, kvh = q.shape[0], k.shape[1]
    k = k.double().repeat_interleave(h // kvh, dim=1)
    v = v.double().repeat_interleave(h // kvh, dim=1)
    scores = torch.einsum("hd,shd->hs", q.double(), k) / math.sqrt(q.shape[-1])
    return torch.einsum("hs,shd->hd", scores.softmax(-1), v)


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Logits equal up to rounding: TOL[dtype] of their scale (float32 rounding at 64 is 8e-6)."""
    err = (got - want).abs().max().item()
    bound = TOL[dtype] * max(1.0, want.abs().max().item())
    assert err <= bound, f"{what}: mirror vs paged logits differ by {err} (bound {bound})"


def _boom(x: torch.Tensor, prefill: bool = False, *, decode_rows: int | None = None) -> torch.Tensor:
    raise RuntimeError("injected failure")


@contextlib.contextmanager
def failing_layer(model: LlamaModel, layer: int) -> Iterator[None]:
    """Layer `layer`'s output projection raises: its attention (and every earlier layer) has run by then."""
    saved = model.layers[layer]
    model.layers[layer] = dataclasses.replace(saved, o=_boom)
    try:
        yield
    finally:
        model.layers[layer] = saved


@contextlib.contextmanager
def failing_attend(at_call: int) -> Iterator[None]:
    """`MirrorStep.attend` raises on its `at_call`-th call (0-based), after that layer's K/V went into the row."""
    original = MirrorStep.attend
    calls = [0]

    def attend(self: MirrorStep, layer: int, q: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if calls[0] - 1 == at_call:
            raise RuntimeError("injected failure")
        return original(self, layer, q)

    with mock.patch.object(MirrorStep, "attend", attend):
        yield


@dataclasses.dataclass
class Seq:
    """One sequence: every token so far (the last one's K/V not yet computed) and its pages in each pool."""

    ids: list[int]
    tables: tuple[list[int], list[int]]


class Twin:
    """The same sequences in two pools: pool 0 decoded through a DecodeMirror, pool 1 by the paged paths alone.

    Pool 1 hands out pages in the opposite order, so the two never share a layout. Every decoded token is then
    a fixed pseudo-random id, the same for both, so the schedules do not depend on the logits compared."""

    def __init__(self, model: LlamaModel, max_bytes: int = 1 << 30) -> None:
        self.model = model
        self.pools = (model.new_pool(BLOCKS, PAGE), model.new_pool(BLOCKS, PAGE))
        self.free: tuple[list[int], list[int]] = (list(range(BLOCKS))[::-1], list(range(BLOCKS)))
        self.seqs: dict[Hashable, Seq] = {}
        self.mirror = DecodeMirror(model.config, model.dtype, CPU, max_bytes)
        self.rng = random.Random(1)
        self.steps = 0

    def _reserve(self, seq: Seq, n: int) -> None:
        for i in (0, 1):
            while len(seq.tables[i]) * PAGE < n:
                seq.tables[i].append(self.free[i].pop())

    def join(self, key: Hashable, prompt: list[int]) -> None:
        """Prefill all of `prompt` but its last token (which the next decode step feeds) into both pools."""
        seq = Seq(list(prompt), ([], []))
        self.seqs[key] = seq
        if len(prompt) > 1:
            self._reserve(seq, len(prompt) - 1)
            for i in (0, 1):
                self.model.prefill(prompt[:-1], 0, seq.tables[i], self.pools[i])

    def leave(self, key: Hashable) -> None:
        seq = self.seqs.pop(key)
        for i in (0, 1):
            self.free[i].extend(seq.tables[i])

    def rekey(self, old: Hashable, new: Hashable) -> None:
        """What a preemption looks like to the mirror: the same content under a new key."""
        self.seqs[new] = self.seqs.pop(old)

    def lengths(self, keys: Sequence[Hashable]) -> list[int]:
        return [len(self.seqs[k].ids) for k in keys]

    def mirrored(self, keys: Sequence[Hashable], commit: bool = True) -> tuple[torch.Tensor, MirrorStep | None]:
        """Decode `keys` (in that batch order) in pool 0 through the mirror. Does not advance the sequences."""
        seqs = [self.seqs[k] for k in keys]
        lengths = self.lengths(keys)
        for s in seqs:
            self._reserve(s, len(s.ids))
        tables = [s.tables[0] for s in seqs]
        meta = build_decode_meta(tables, lengths, PAGE, CPU)
        step = self.mirror.prepare(list(keys), tables, lengths, self.pools[0])
        logits = self.model.decode([s.ids[-1] for s in seqs], meta, self.pools[0], step)
        if step is not None and commit:
            self.mirror.commit(step)
        return logits, step

    def paged(self, keys: Sequence[Hashable]) -> torch.Tensor:
        """Decode `keys` in pool 1 without a mirror: batched (gather path) on even steps, one sequence at a
        time (in-place runs path where the pages allow) on odd ones."""
        seqs = [self.seqs[k] for k in keys]
        for s in seqs:
            self._reserve(s, len(s.ids))
        if self.steps % 2 == 0 or len(seqs) == 1:
            meta = build_decode_meta([s.tables[1] for s in seqs], self.lengths(keys), PAGE, CPU)
            return self.model.decode([s.ids[-1] for s in seqs], meta, self.pools[1])
        outs = []
        for s in seqs:
            meta = build_decode_meta([s.tables[1]], [len(s.ids)], PAGE, CPU)
            outs.append(self.model.decode([s.ids[-1]], meta, self.pools[1]))
        return torch.cat(outs)

    def advance(self, keys: Sequence[Hashable]) -> None:
        for k in keys:
            self.seqs[k].ids.append(self.rng.randrange(1, self.model.config.vocab_size))
        self.steps += 1

    def step(self, keys: Sequence[Hashable], commit: bool = True) -> MirrorStep | None:
        """One decode step of `keys` down both paths; asserts equal logits, then advances the sequences."""
        got, step = self.mirrored(keys, commit)
        want = self.paged(keys)
        assert_close(got, want, self.model.dtype, f"step {self.steps}")
        self.advance(keys)
        return step


def llama(dtype: torch.dtype = torch.float32, model: RandomModel = MODEL) -> LlamaModel:
    return LlamaModel(model.config, model.weights, dtype=dtype)


def run_together(engine: Engine, prompts: list[list[int]], max_new: list[int]) -> list:
    release = hold_engine_loop(engine)
    handles = [engine.submit(p, n, ignore_eos=True, return_logits=True) for p, n in zip(prompts, max_new, strict=True)]
    release()
    return [h.result(60) for h in handles]


def assert_same_results(got: list, want: list) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        assert (a.logits - b.logits).abs().max().item() < 1e-4
