"""The decode mirror (radixcache.runtime.kv.mirror) changes nothing but where decode attention reads its KV.

Checked against independent expectations:
- `MirrorStep.attend` against a naive float64 softmax attention over the pool's K/V read slot by slot (KV heads
  repeated in the reference only), for batches of different lengths whose rows are not in batch order;
- `model.decode` with a mirror step against `model.decode` without one (the paged gather and in-place runs
  paths) on a second pool that holds the same sequences in other pages, over schedules where sequences join,
  leave, grow past the 256-position growth step and shrink the batch, in float32 and float64;
- "no copy per step": `positions_loaded` grows by n - 1 when a sequence of length n joins and never on later
  steps; a new key (preemption) and a step that raised before `commit` are refilled from the pool;
- a forward that raises mid-way leaves the mirror usable: the next step still equals the paged path;
- the memory bound: past `max_bytes` `prepare` returns None and frees the mirror; an Engine with a small
  `mirror_memory` gives the tokens of `mirror_memory=0` and of the default, also under preemption;
- argument errors; a hypothesis property over random join / leave / step / fail / re-key schedules.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
from collections.abc import Hashable, Iterator, Sequence
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime import Engine
from radixcache.runtime.kv.mirror import DecodeMirror, MirrorStep
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.testing import RandomModel, hold_engine_loop, tiny_config, tiny_model

CPU = torch.device("cpu")
PAGE = 16
BLOCKS = 256
TOL = {torch.float32: 2e-6, torch.float64: 1e-12}  # of the logits' scale: max(1, max |logit|)
MODEL = tiny_model(seed=7)  # module level: the hypothesis test cannot take function-scoped fixtures


# ---------------------------------------------------------------------------------------------------- helpers


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


def _boom(x: torch.Tensor, prefill: bool = False) -> torch.Tensor:
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


@pytest.fixture(scope="module")
def models() -> dict[torch.dtype, LlamaModel]:
    return {dt: llama(dt) for dt in (torch.float32, torch.float64)}


# ---------------------------------------------------------------------------------------------------- 1. attend


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 4), (8, 2)])
@pytest.mark.parametrize("same_lengths", [False, True])
def test_attend_equals_naive_attention_over_rows_out_of_batch_order(
    dtype: torch.dtype, heads: int, kv_heads: int, same_lengths: bool
) -> None:
    config = tiny_config(num_heads=heads, num_kv_heads=kv_heads, head_dim=8)
    g = torch.Generator().manual_seed(3)
    pool = KVPool(config, 64, 4, dtype=dtype)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=g, dtype=torch.float64))
    mirror = DecodeMirror(config, dtype, CPU, 1 << 30)
    tables = {key: random.Random(key).sample(range(64), 12) for key in "abcd"}
    first = {"a": 7, "b": 30, "c": 1, "d": 20} if not same_lengths else dict.fromkeys("abcd", 13)
    # Step 1 puts a, b, c in rows 0, 1, 2 and writes their position n - 1 as a forward would (the pool's
    # values, which stand for what the forward wrote there too); step 2 asks for d, c, a, b: rows 3, 2, 0, 1.
    step1 = mirror.prepare(list("abc"), [tables[k] for k in "abc"], [first[k] for k in "abc"], pool)
    assert step1 is not None and step1.order is None and step1.inverse is None
    for layer in range(config.num_layers):
        last = [read_sequence(pool, layer, tables[k], first[k]) for k in "abc"]
        step1.write(layer, torch.stack([k[-1] for k, _ in last]), torch.stack([v[-1] for _, v in last]))
    mirror.commit(step1)
    keys = list("dcab")
    lengths = [first[k] + 1 for k in keys]  # d joins; a..c grew by the token decoded in step 1
    step = mirror.prepare(keys, [tables[k] for k in keys], lengths, pool)
    assert step is not None and step.rows == (3, 2, 0, 1)
    assert step.order is not None and step.inverse is not None
    assert (step.mask is None) == same_lengths
    assert mirror.positions_loaded == sum(first[k] - 1 for k in "abc") + first["d"]
    for layer in range(config.num_layers):
        q = torch.randn(4, heads, 8, generator=g, dtype=torch.float64).to(dtype)
        k_new = torch.randn(4, kv_heads, 8, generator=g, dtype=torch.float64).to(dtype)
        v_new = torch.randn(4, kv_heads, 8, generator=g, dtype=torch.float64).to(dtype)
        step.write(layer, k_new, v_new)
        out = step.attend(layer, q)
        assert out.shape == (4, heads, 8) and out.dtype == dtype
        for i, (key, n) in enumerate(zip(keys, lengths, strict=True)):
            k_seq, v_seq = read_sequence(pool, layer, tables[key], n - 1)
            k_all = torch.cat([k_seq, k_new[i : i + 1]])
            v_all = torch.cat([v_seq, v_new[i : i + 1]])
            want = naive_attention(q[i], k_all, v_all)
            err = (out[i].double() - want).abs().max().item()
            assert err < (1e-5 if dtype == torch.float32 else 1e-12), (key, layer, err)


def test_attend_on_the_first_step_of_every_sequence_reads_only_the_pool() -> None:
    """Rows filled from the pool in one step (no earlier commit), lengths all different, batch order kept."""
    config = MODEL.config
    pool = KVPool(config, 32, 4)
    pool.kv.normal_(generator=torch.Generator().manual_seed(5))
    mirror = DecodeMirror(config, torch.float32, CPU, 1 << 30)
    tables = [[3, 9, 1], [0], [31, 30, 29, 28, 2]]
    lengths = [10, 2, 17]
    step = mirror.prepare(["x", "y", "z"], tables, lengths, pool)
    assert step is not None and step.order is None and step.mask is not None
    g = torch.Generator().manual_seed(6)
    for layer in range(config.num_layers):
        q = torch.randn(3, config.num_heads, config.head_dim, generator=g)
        k_new = torch.randn(3, config.num_kv_heads, config.head_dim, generator=g)
        v_new = torch.randn(3, config.num_kv_heads, config.head_dim, generator=g)
        step.write(layer, k_new, v_new)
        out = step.attend(layer, q)
        for i, (table, n) in enumerate(zip(tables, lengths, strict=True)):
            k_seq, v_seq = read_sequence(pool, layer, table, n - 1)
            want = naive_attention(q[i], torch.cat([k_seq, k_new[i : i + 1]]), torch.cat([v_seq, v_new[i : i + 1]]))
            assert (out[i].double() - want).abs().max().item() < 1e-5


# ---------------------------------------------------------------------------------------------------- 2. decode


def run_schedule(twin: Twin) -> list[tuple[int, int]]:
    """Join, grow past 256 positions, shuffle the batch order, leave, shrink, join again. Returns the mirror's
    capacity after every step."""
    caps = []
    order = random.Random(2)

    def steps(n: int) -> None:
        for _ in range(n):
            keys = list(twin.seqs)
            order.shuffle(keys)
            assert twin.step(keys) is not None
            caps.append(twin.mirror.capacity)

    twin.join("a", ids(5, 1))
    twin.join("b", ids(40, 2))
    steps(3)
    twin.join("c", ids(250, 3))  # crosses 256 positions after 7 more steps
    twin.join("d", ids(1, 4))  # a first token: nothing to load
    twin.join("e", ids(17, 5))
    steps(9)
    twin.leave("b")
    twin.leave("d")
    steps(2)
    twin.leave("a")
    twin.leave("e")
    steps(3)  # c alone: 1 row of 512 where 8 were allocated, so the mirror shrinks
    twin.join("f", ids(3, 6))
    steps(3)
    return caps


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decode_through_the_mirror_equals_the_paged_paths_over_a_schedule(models: dict, dtype: torch.dtype) -> None:
    twin = Twin(models[dtype])
    caps = run_schedule(twin)  # every step asserts equal logits
    assert caps[0] == (2, 256)
    assert (8, 256) in caps and (8, 512) in caps, "the span must grow past 256 with 5 rows"
    assert (1, 512) in caps, "the batch must shrink to one row"
    assert caps[-1] == (2, 512)
    assert twin.mirror.reallocations >= 4


@pytest.mark.parametrize(
    "variant",
    [{"arch": "qwen2", "attention_bias": True}, {"tie_embeddings": True, "num_kv_heads": 4}, {"num_heads": 8}],
    ids=["qwen2-bias", "mha", "gqa4"],
)
def test_decode_through_the_mirror_equals_the_paged_paths_for_other_head_layouts(variant: dict) -> None:
    m = tiny_model(seed=11, **variant)
    twin = Twin(LlamaModel(m.config, m.weights))
    twin.join(0, ids(30, 7))
    twin.join(1, ids(9, 8))
    for i in range(4):
        twin.step([1, 0] if i % 2 else [0, 1])
    twin.join(2, ids(2, 9))
    for _ in range(3):
        twin.step([2, 0, 1])


# ---------------------------------------------------------------------------------------------------- 3. no copy


def test_rows_are_filled_once_per_join_and_refilled_after_rekey_or_a_failed_step(models: dict) -> None:
    twin = Twin(models[torch.float32])
    m = twin.mirror
    twin.join("a", ids(10, 11))
    twin.join("b", ids(1, 12))
    twin.step(["a", "b"])
    assert m.positions_loaded == 9 + 0
    for _ in range(3):
        twin.step(["b", "a"])
    assert m.positions_loaded == 9, "sequences in sync are never copied again"
    twin.join("c", ids(250, 13))
    twin.step(["a", "c", "b"])
    assert m.positions_loaded == 9 + 249
    for _ in range(8):  # the span passes 256: the reallocation moves the rows, it loads nothing from the pool
        twin.step(["c", "a", "b"])
    assert m.capacity[1] == 512 and m.positions_loaded == 9 + 249
    twin.rekey("a", ("a", 1))  # preempted and back: same content, new key, refilled
    n_a = len(twin.seqs["a", 1].ids)
    twin.step([("a", 1), "b", "c"])
    assert m.positions_loaded == 9 + 249 + n_a - 1
    before = m.positions_loaded
    twin.mirrored(["b", "c"], commit=False)  # the forward ran, but the step was never committed
    want_b_c = sum(n - 1 for n in twin.lengths(["b", "c"]))
    twin.step(["b", "c"])  # a left; the same positions again
    assert m.positions_loaded == before + want_b_c
    twin.step(["b", "c"])
    assert m.positions_loaded == before + want_b_c


def test_a_step_that_raised_is_refilled_and_nothing_else_is(models: dict) -> None:
    twin = Twin(models[torch.float32])
    twin.join("a", ids(20, 14))
    twin.join("b", ids(33, 15))
    twin.step(["a", "b"])
    loaded = twin.mirror.positions_loaded
    with failing_attend(at_call=1), pytest.raises(RuntimeError, match="injected"):
        twin.mirrored(["a", "b"])
    twin.join("c", ids(4, 16))
    lengths = twin.lengths(["a", "b", "c"])
    twin.step(["a", "b", "c"])
    assert twin.mirror.positions_loaded == loaded + sum(n - 1 for n in lengths)
    twin.step(["a", "b", "c"])
    assert twin.mirror.positions_loaded == loaded + sum(n - 1 for n in lengths)


# ---------------------------------------------------------------------------------------------------- 4. failure


@pytest.mark.parametrize("where", ["attend-0", "attend-1", "layer-0", "layer-1"])
@pytest.mark.parametrize("then", ["retry", "one-leaves", "one-joins"])
def test_a_forward_that_raises_mid_way_leaves_no_corrupted_state(models: dict, where: str, then: str) -> None:
    model = models[torch.float32]
    twin = Twin(model)
    twin.join("a", ids(12, 17))
    twin.join("b", ids(26, 18))
    twin.join("c", ids(3, 19))
    for _ in range(2):
        twin.step(["c", "a", "b"])
    kind, index = where.split("-")
    ctx = failing_attend(int(index)) if kind == "attend" else failing_layer(model, int(index))
    with ctx, pytest.raises(RuntimeError, match="injected"):
        twin.mirrored(["b", "c", "a"])
    keys = ["b", "c", "a"]
    if then == "one-leaves":
        twin.leave("c")
        keys = ["a", "b"]
    elif then == "one-joins":
        twin.join("d", ids(8, 20))
        keys = ["d", "a", "b", "c"]
    for _ in range(3):
        twin.step(keys)  # asserts mirror logits == paged logits


# ---------------------------------------------------------------------------------------------------- 5. budget


def test_prepare_past_max_bytes_returns_none_and_frees_the_mirror(models: dict) -> None:
    model = models[torch.float32]
    per_row = 256 * DecodeMirror(model.config, model.dtype, CPU, 0).bytes_per_position  # one row of 256 positions
    twin = Twin(model, max_bytes=2 * per_row)
    m = twin.mirror
    assert m.bytes_per_position == 2 * 2 * 2 * 8 * 4
    twin.join("a", ids(9, 21))
    twin.join("b", ids(14, 22))
    assert twin.step(["a", "b"]) is not None
    assert m.nbytes == 2 * per_row
    twin.join("c", ids(5, 23))
    assert twin.step(["a", "b", "c"]) is None  # 4 rows wanted: over the budget, the paged paths ran
    assert m.nbytes == 0 and m.capacity == (0, 0)
    twin.leave("c")
    loaded = m.positions_loaded
    lengths = twin.lengths(["b", "a"])
    assert twin.step(["b", "a"]) is not None  # back under the budget: both rows refilled
    assert m.positions_loaded == loaded + sum(n - 1 for n in lengths)
    twin.join("d", ids(250, 24))
    twin.leave("a")
    twin.leave("b")
    for _ in range(5):
        assert twin.step(["d"]) is not None  # one row of 256
    assert m.capacity == (2, 256), "within twice what the batch needs, the allocation is kept"
    for _ in range(3):
        assert twin.step(["d"]) is not None  # one row of 512: the whole budget
    assert m.capacity == (1, 512) and m.nbytes <= m.max_bytes
    tight = Twin(model, max_bytes=per_row - 1)
    tight.join("x", ids(3, 25))
    assert tight.step(["x"]) is None and tight.mirror.nbytes == 0


def run_together(engine: Engine, prompts: list[list[int]], max_new: list[int]) -> list:
    release = hold_engine_loop(engine)
    handles = [engine.submit(p, n, ignore_eos=True, return_logits=True) for p, n in zip(prompts, max_new, strict=True)]
    release()
    return [h.result(60) for h in handles]


def assert_same_results(got: list, want: list) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        assert (a.logits - b.logits).abs().max().item() < 1e-4


def test_an_engine_with_a_small_mirror_budget_gives_the_same_tokens(tiny: RandomModel) -> None:
    prompts = [ids(240, 30), ids(7, 31), ids(60, 32), ids(19, 33)]
    max_new = [24, 4, 8, 12]  # the batch shrinks from 4 to 1; the first crosses 256 positions
    small = Engine(tiny, capacity_blocks=128, page_size=8, mirror_memory=150_000)  # up to 2 rows of 256
    assert small.mirror is not None and small.mirror.max_bytes == 150_000
    stepped: list[bool] = []
    prepare = small.mirror.prepare

    def recording(*args: object) -> MirrorStep | None:
        step = prepare(*args)  # type: ignore[arg-type]
        stepped.append(step is not None)
        assert small.mirror is not None and small.mirror.nbytes <= 150_000
        return step

    small.mirror.prepare = recording  # type: ignore[method-assign]
    got = run_together(small, prompts, max_new)
    off = run_together(Engine(tiny, capacity_blocks=128, page_size=8, mirror_memory=0), prompts, max_new)
    default = Engine(tiny, capacity_blocks=128, page_size=8)
    on = run_together(default, prompts, max_new)
    assert_same_results(got, off)
    assert_same_results(on, off)
    assert False in stepped and True in stepped, "both the paged and the mirror paths must have run"
    assert default.mirror is not None and default.mirror.positions_loaded > 0


# ---------------------------------------------------------------------------------------------------- 6. preemption


def test_preemption_gives_the_same_tokens_with_the_mirror_on_and_off(tiny: RandomModel) -> None:
    prompts = [ids(20, 300 + i) for i in range(8)]
    on = Engine(tiny, capacity_blocks=40, page_size=4)  # 8 requests need ~100 pages at their ends
    off = Engine(tiny, capacity_blocks=40, page_size=4, mirror_memory=0)
    assert on.mirror is not None and off.mirror is None
    a = on.generate(prompts, 30, ignore_eos=True, return_logits=True)
    b = off.generate(prompts, 30, ignore_eos=True, return_logits=True)
    assert_same_results(a, b)
    assert on.stats.preemptions > 0 and off.stats.preemptions > 0
    # Each request's context is loaded at least once, at its first decode step (again after each preemption).
    assert on.mirror.positions_loaded >= sum(len(p) - 1 for p in prompts)


def test_sessions_in_a_tiny_pool_with_preemption_match_the_mirror_off(tiny: RandomModel) -> None:
    histories = [ids(24, 100 + i % 3) + ids(5 + i, 1000 + i) for i in range(8)]

    async def run(engine: Engine) -> list:
        release = hold_engine_loop(engine)
        tasks = [engine.agenerate(h, 6 + i % 3, ignore_eos=True, return_logits=True) for i, h in enumerate(histories)]
        futures = [asyncio.ensure_future(t) for t in tasks]
        await asyncio.sleep(0)
        release()
        return list(await asyncio.gather(*futures))

    on = Engine(tiny, capacity_blocks=24, page_size=4, max_prefill_tokens=48)
    off = Engine(tiny, capacity_blocks=24, page_size=4, max_prefill_tokens=48, mirror_memory=0)
    assert_same_results(asyncio.run(run(on)), asyncio.run(run(off)))
    assert on.stats.preemptions > 0


# ---------------------------------------------------------------------------------------------------- 7. errors


def test_prepare_rejects_bad_arguments(models: dict) -> None:
    model = models[torch.float32]
    pool = model.new_pool(8, PAGE)
    mirror = DecodeMirror(model.config, model.dtype, CPU, 1 << 20)
    with pytest.raises(ValueError, match="distinct"):
        mirror.prepare(["a", "a"], [[0], [1]], [3, 4], pool)
    with pytest.raises(ValueError, match="one key, block table and length"):
        mirror.prepare(["a", "b"], [[0]], [3, 4], pool)
    with pytest.raises(ValueError, match="one key, block table and length"):
        mirror.prepare(["a", "b"], [[0], [1]], [3], pool)
    with pytest.raises(ValueError, match="at least one"):
        mirror.prepare([], [], [], pool)
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        DecodeMirror(model.config, model.dtype, CPU, -1)
    assert mirror.nbytes == 0 and mirror.capacity == (0, 0)


def test_decode_rejects_a_step_prepared_for_other_lengths(models: dict) -> None:
    model = models[torch.float32]
    pool = model.new_pool(8, PAGE)
    mirror = DecodeMirror(model.config, model.dtype, CPU, 1 << 20)
    step = mirror.prepare(["a", "b"], [[0], [1]], [3, 5], pool)
    assert step is not None
    meta = build_decode_meta([[0], [1]], [3, 6], PAGE, CPU)
    with pytest.raises(ValueError, match=r"mirror step lengths \(3, 5\) do not match the decode's \(3, 6\)"):
        model.decode([1, 2], meta, pool, step)
    one = build_decode_meta([[0]], [3], PAGE, CPU)
    with pytest.raises(ValueError, match="do not match"):
        model.decode([1], one, pool, step)


def test_engine_mirror_memory_settings(tiny: RandomModel) -> None:
    assert Engine(tiny, capacity_blocks=16, mirror_memory=0).mirror is None
    default = Engine(tiny, capacity_blocks=16)
    assert isinstance(default.mirror, DecodeMirror) and default.mirror.max_bytes == 512 * 2**20
    for memory, want in (("64MiB", 64 * 2**20), (4096, 4096)):
        mirror = Engine(tiny, capacity_blocks=16, mirror_memory=memory).mirror
        assert mirror is not None and mirror.max_bytes == want
    with pytest.raises(ValueError, match="cannot parse memory budget"):
        Engine(tiny, capacity_blocks=16, mirror_memory="lots")
    with pytest.raises(ValueError, match="must be positive"):
        Engine(tiny, capacity_blocks=16, mirror_memory=-5)


# ---------------------------------------------------------------------------------------------------- 8. property

PROMPT_LENGTHS = [1, 2, 15, 16, 17, 64, 200, 255, 256, 257, 300]
PROPERTY_MODEL = llama()
ROW = 256 * 2 * 2 * 2 * 8 * 4  # bytes of one row of 256 positions of the tiny model in float32
ops = st.lists(
    st.tuples(st.sampled_from(["join", "leave", "step", "fail", "nocommit", "rekey"]), st.integers(0, 10**6)),
    min_size=1,
    max_size=14,
)


@settings(max_examples=25, deadline=None)
@given(ops=ops, budget=st.sampled_from([1 << 30, 2 * ROW, 4 * ROW]))
def test_any_schedule_of_steps_gives_the_paged_logits(ops: list[tuple[str, int]], budget: int) -> None:
    model = PROPERTY_MODEL
    twin = Twin(model, max_bytes=budget)
    fresh = iter(range(10**9))
    for op, x in ops:
        keys = list(twin.seqs)
        random.Random(x).shuffle(keys)
        if op == "join" and len(keys) < 5:
            twin.join(next(fresh), ids(PROMPT_LENGTHS[x % len(PROMPT_LENGTHS)], x))
        elif op == "leave" and keys:
            twin.leave(keys[0])
        elif op == "rekey" and keys:
            twin.rekey(keys[0], next(fresh))
        elif op == "fail" and keys:
            with failing_layer(model, x % model.config.num_layers), pytest.raises(RuntimeError, match="injected"):
                twin.mirrored(keys)
        elif op == "nocommit" and keys:
            got, _ = twin.mirrored(keys, commit=False)
            want = twin.paged(keys)
            assert_close(got, want, model.dtype, "uncommitted step")
            twin.advance(keys)
        elif keys:
            want_rows = 1 << (len(keys) - 1).bit_length()
            want_span = -(-max(twin.lengths(keys)) // 256) * 256
            step = twin.step(keys)
            assert (step is None) == (want_rows * want_span * twin.mirror.bytes_per_position > budget)
        assert twin.mirror.nbytes <= budget
        for k in [k for k, s in twin.seqs.items() if len(s.ids) >= model.config.max_position]:
            twin.leave(k)
    if twin.seqs:
        twin.step(list(twin.seqs))
