"""The native paged attention (runtime/native/decode_attention.c `native_paged_attention`, `NativeDecodeOps.
attend_pages`): a few queries of one sequence, causal, over K/V read in place from pool pages in any order, against
attention computed in float64 over the positions gathered by hand; the same bits on one and two threads; bad
tables refused with nothing written; and in the model, a one-token chunk and a decode without a mirror take it."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.native.ops import PAGED_ROWS, NativeDecodeOps
from radixcache.runtime.testing import tiny_model

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the native kernels need a C compiler"
)


@pytest.fixture(scope="module")
def ops() -> NativeDecodeOps:
    return NativeDecodeOps()


def pages_of(length: int, page: int, blocks: int, kvh: int, d: int, seed: int):
    """A pool layer's K and V `[blocks, page, kvh, d]` and a shuffled table of the blocks holding `length` positions."""
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(2, blocks, page, kvh, d, generator=g).unbind(0)
    table = torch.randperm(blocks, generator=g)[: -(-length // page)]
    return k, v, table


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, start: int) -> torch.Tensor:
    """Causal attention in float64 of q `[n, H, D]` at positions start.. over the gathered positions."""
    n, h, d = q.shape
    kvh = k.shape[2]
    length = start + n
    keys = k[table].reshape(-1, kvh, d)[:length].double()  # [S, KV, D], in position order
    values = v[table].reshape(-1, kvh, d)[:length].double()
    out = torch.empty(n, h, d, dtype=torch.float64)
    for t in range(n):
        for hq in range(h):
            kv = hq // (h // kvh)
            s = keys[: start + t + 1, kv] @ q[t, hq].double() / d**0.5
            out[t, hq] = torch.softmax(s, 0) @ values[: start + t + 1, kv]
    return out


@pytest.mark.parametrize(
    ("n", "start", "page", "heads", "kvh", "d"),
    [
        (1, 0, 16, 9, 3, 64),  # one position
        (1, 1999, 16, 9, 3, 64),  # SmolLM2's shape: a decode or the last token of a prompt found whole
        (1, 127, 16, 9, 3, 64),  # the span boundary
        (1, 128, 16, 9, 3, 64),
        (3, 300, 16, 9, 3, 64),  # 27 rows: two slices of 16
        (5, 16, 4, 4, 4, 32),  # one KV head per query head, pages of 4
        (2, 40, 1, 6, 2, 48),  # pages of one position; a head size the vector loop does not divide
        (6, 0, 8, 2, 1, 16),  # a chunk from position 0: the causal part only
    ],
)
def test_paged_attention_equals_float64_attention_over_the_gathered_positions(
    ops: NativeDecodeOps, n: int, start: int, page: int, heads: int, kvh: int, d: int
) -> None:
    length = start + n
    k, v, table = pages_of(length, page, -(-length // page) + 7, kvh, d, seed=n * 1000 + start)
    q = torch.randn(n, heads, d, generator=torch.Generator().manual_seed(start)) * 2
    before = (k.clone(), v.clone())
    got = ops.attend_pages(q, k, v, table, start)
    assert got.shape == (n, heads, d)
    assert (got.double() - reference(q, k, v, table, start)).abs().max().item() < 2e-5
    assert torch.equal(k, before[0]) and torch.equal(v, before[1])  # read only


def test_paged_attention_gives_the_same_bits_on_one_and_on_two_threads(ops: NativeDecodeOps) -> None:
    """Work is split by position spans and row slices fixed by the shape, merged in position order: the engine
    changes its thread count with the machine's load, and a greedy answer must not change."""
    k, v, table = pages_of(2000, 16, 140, 3, 64, seed=3)
    q = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(4))
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            outs.append(ops.attend_pages(q, k, v, table, 1998))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.parametrize(
    ("table", "start", "message"),
    [
        ([0, 1], 40, "refused 1 queries at 40"),  # 41 positions need 3 pages of 16
        ([0, 9], 20, "refused"),  # block 9 is outside a pool of 8
        ([0, -1], 20, "refused"),
    ],
)
def test_a_table_that_does_not_hold_the_positions_is_refused(
    ops: NativeDecodeOps, table: list[int], start: int, message: str
) -> None:
    k, v = torch.zeros(2, 8, 16, 3, 64).unbind(0)
    with pytest.raises(ValueError, match=message):
        ops.attend_pages(torch.zeros(1, 9, 64), k, v, torch.tensor(table), start)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("float64 queries", "float32 CPU queries"),  # read as float32: garbage
        ("float64 values", "float32 CPU queries"),
        ("head size 32 against 64", "head size 32 cannot attend to keys of head size 64"),  # read past q's rows
        ("float table", "1-D integer ids"),  # 0.7 truncated to block 0
        ("2-D table", "1-D integer ids"),
        ("start 2**32", "start 4294967296 is out of range"),  # wrapped to position 0 by the C int
    ],
)
def test_arguments_the_kernel_would_misread_are_refused(ops: NativeDecodeOps, case: str, message: str) -> None:
    """Each of these returned an answer (from misread memory) before the wrapper checked it."""
    k, v, table = pages_of(20, 16, 8, 3, 64, seed=5)
    q, start = torch.randn(1, 9, 64), 19
    if case == "float64 queries":
        q = q.double()
    elif case == "float64 values":
        v = v.double()
    elif case.startswith("head size"):
        q = q[..., :32]
    elif case == "float table":
        table = table.float() + 0.5
    elif case == "2-D table":
        table = table[:, None]
    else:
        start = 2**32
    with pytest.raises(ValueError, match=message):
        ops.attend_pages(q, k, v, table, start)


def test_pages_whose_rows_are_not_dense_are_refused(ops: NativeDecodeOps) -> None:
    k = torch.zeros(8, 3, 16, 64).transpose(1, 2)  # [blocks, page, kv, d] with heads strided by a page
    assert not ops.supports_pages(k)
    with pytest.raises(ValueError, match="dense rows"):
        ops.attend_pages(torch.zeros(1, 9, 64), k, k, torch.tensor([0]), 0)


def test_the_model_takes_the_paged_kernel_for_a_short_chunk_and_a_decode_without_mirror(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = tiny_model(seed=2)
    model = LlamaModel(m.config, m.weights)
    if model.native is None:
        pytest.skip("the native library did not build here")
    calls: list[tuple[int, int]] = []
    real = NativeDecodeOps.attend_pages

    def counted(self, q, k_pages, v_pages, table, start):  # type: ignore[no-untyped-def]
        calls.append((q.shape[0], start))
        return real(self, q, k_pages, v_pages, table, start)

    monkeypatch.setattr(NativeDecodeOps, "attend_pages", counted)
    layers = m.config.num_layers
    assert m.config.num_heads <= PAGED_ROWS
    ids = torch.randint(1, m.config.vocab_size, (22,), generator=torch.Generator().manual_seed(5)).tolist()
    table = list(range(6))
    whole = model.prefill(ids, 0, table, model.new_pool(16, 4), all_logits=True)  # 22 rows: PyTorch's flash path
    assert not calls
    pool = model.new_pool(16, 4)
    model.prefill(ids[:20], 0, table, pool)
    last = model.prefill(ids[20:21], 20, table, pool)  # one row at position 20 over the 20 before it
    assert calls == [(1, 20)] * layers
    assert (last - whole[20]).abs().max().item() < 1e-4
    calls.clear()
    meta = build_decode_meta([table], [22], 4, model.device)
    step = model.decode([ids[21]], meta, pool)  # a decode without a mirror: the paged kernel too
    assert calls == [(1, 21)] * layers
    assert (step[0] - whole[21]).abs().max().item() < 1e-4


@pytest.mark.parametrize(
    ("heads", "kv_heads", "d", "length"),
    [
        (9, 3, 64, 600),  # SmolLM2: decode_attention.c's vector span (16 scores reduced at once), 4 + 1 spans
        (10, 2, 64, 33),  # groups of 5 query heads: outputs in groups of 4, then 1; positions past 32
        (34, 2, 64, 200),  # 17 query heads a KV head: two slices of a group
        (8, 2, 128, 47),  # head size 128: outputs in groups of 2
        (6, 1, 128, 129),
        (9, 3, 16, 150),  # a head size the vector span does not take: both kernels score one position at a time
    ],
)
def test_decode_attention_over_rows_gives_the_paged_kernels_bits(
    ops: NativeDecodeOps, heads: int, kv_heads: int, d: int, length: int
) -> None:
    """A decode over mirror rows scores 16 positions at once (head sizes 64 and 128 with AVX-512) where the paged
    kernel scores one at a time; both sum each score's lanes by the same tree and the outputs in the same position
    order, so the last position's query gets the same bits from either."""
    page = 16
    k, v, table = pages_of(length, page, -(-length // page) + 2, kv_heads, d, seed=heads + d)
    q = torch.randn(1, heads, d, generator=torch.Generator().manual_seed(length)) * 2
    paged = ops.attend_pages(q, k, v, table, length - 1)
    rows_k = k[table].reshape(-1, kv_heads, d)[:length].permute(1, 0, 2).unsqueeze(0).contiguous()  # [1, KV, S, D]
    rows_v = v[table].reshape(-1, kv_heads, d)[:length].permute(1, 0, 2).unsqueeze(0).contiguous()
    mirror = ops.attend(q, rows_k, rows_v, [length])
    assert torch.equal(mirror, paged)
    torch.testing.assert_close(mirror.double(), reference(q, k, v, table, length - 1), rtol=1e-5, atol=1e-6)


def test_a_nan_query_head_fails_alone_and_alike_in_both_kernels(ops: NativeDecodeOps) -> None:
    """A NaN score is skipped by both kernels' maximum (the vector span keeps a vector of maxima): the head whose
    query holds a NaN gets NaN outputs, every other head its usual bits, from either kernel."""
    heads, kv_heads, d, length, page = 9, 3, 64, 150, 16
    k, v, table = pages_of(length, page, -(-length // page) + 2, kv_heads, d, seed=5)
    q = torch.randn(1, heads, d, generator=torch.Generator().manual_seed(6))
    q[0, 4, 7] = float("nan")  # the second query head of KV head 1
    paged = ops.attend_pages(q, k, v, table, length - 1)
    rows_k = k[table].reshape(-1, kv_heads, d)[:length].permute(1, 0, 2).unsqueeze(0).contiguous()
    rows_v = v[table].reshape(-1, kv_heads, d)[:length].permute(1, 0, 2).unsqueeze(0).contiguous()
    mirror = ops.attend(q, rows_k, rows_v, [length])
    nan_heads = [h for h in range(heads) if mirror[0, h].isnan().any()]
    assert nan_heads == [4] and mirror[0, 4].isnan().all()
    assert torch.equal(mirror.nan_to_num(7.0), paged.nan_to_num(7.0))
