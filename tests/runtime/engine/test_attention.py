"""Paged attention equals plain attention: prefill with a position offset, and batched decode over block tables
of sequences with different lengths. GQA is computed per KV head, never with repeated KV heads."""

from __future__ import annotations

import math

import pytest
import torch

from radixcache.runtime.model import attention as attention_module
from radixcache.runtime.model.attention import (
    build_decode_meta,
    causal_mask,
    decode_attention,
    gather_pages,
    prefill_attention,
    split_prefill_attention,
)


def naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, out_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """q [T, H, D], k/v [S, KV, D]; query at position q_pos[t] sees keys 0..q_pos[t]. Computed in float64."""
    h, kvh = q.shape[1], k.shape[1]
    k = k.double().repeat_interleave(h // kvh, dim=1)
    v = v.double().repeat_interleave(h // kvh, dim=1)
    scores = torch.einsum("thd,shd->hts", q.double(), k) / math.sqrt(q.shape[-1])
    future = torch.arange(k.shape[0])[None, :] > q_pos[:, None]
    scores = scores.masked_fill(future, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v).to(out_dtype)


def paged(seq: torch.Tensor, table: list[int], num_blocks: int, page: int) -> torch.Tensor:
    """Scatter a contiguous [S, KV, D] sequence into pages [num_blocks, page, KV, D] along `table`."""
    pages = torch.randn(num_blocks, page, *seq.shape[1:])  # garbage elsewhere: must never be read
    for i in range(seq.shape[0]):
        pages[table[i // page], i % page] = seq[i]
    return pages


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize(("start", "new"), [(0, 7), (5, 3), (16, 1), (13, 9)])
def test_prefill_attends_causally_over_prefix_and_new_tokens(heads: int, kv_heads: int, start: int, new: int) -> None:
    g = torch.Generator().manual_seed(start * 31 + new)
    total, d = start + new, 8
    q = torch.randn(new, heads, d, generator=g)
    k = torch.randn(total, kv_heads, d, generator=g)
    v = torch.randn(total, kv_heads, d, generator=g)
    mask = causal_mask(start, new, total, heads // kv_heads, torch.device("cpu"))
    out = prefill_attention(q, k, v, mask)
    expected = naive(q, k, v, torch.arange(start, total))
    assert out.shape == (new, heads, d)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def _last_axis_stride_two(x: torch.Tensor) -> torch.Tensor:
    """The same values with a last-axis stride of 2, as a one-row chunk's V has (a slice of a transposed
    product): the CPU flash kernel assumes a dense last axis and must not be handed this as is."""
    wide = torch.zeros(*x.shape, 2, dtype=x.dtype)
    wide[..., 0] = x
    out = wide[..., 0]
    assert out.stride(-1) == 2
    return out


@pytest.mark.parametrize("layout", ["dense", "strided"])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (6, 1), (9, 3)])
@pytest.mark.parametrize(("start", "new"), [(0, 1), (0, 7), (5, 3), (16, 1), (13, 9), (40, 33)])
def test_split_prefill_equals_causal_attention_over_prefix_and_chunk(
    heads: int, kv_heads: int, start: int, new: int, layout: str
) -> None:
    """The CPU prefill path (prefix unmasked + chunk causal, merged by log-sum-exp) against float64 naive causal
    attention, in float32 and float64, with dense inputs and with the last-axis stride of a one-row chunk."""
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        g = torch.Generator().manual_seed(start * 31 + new + heads)
        total, d = start + new, 8
        q = torch.randn(new, heads, d, generator=g, dtype=dtype)
        k = torch.randn(total, kv_heads, d, generator=g, dtype=dtype)
        v = torch.randn(total, kv_heads, d, generator=g, dtype=dtype)
        k_new, v_new = k[start:], v[start:]
        if layout == "strided":
            q, k_new, v_new = (_last_axis_stride_two(t) for t in (q, k_new, v_new))
        prefix = (k[:start], v[:start]) if start else (None, None)
        out = split_prefill_attention(q, k_new, v_new, *prefix)
        expected = naive(q, k, v, torch.arange(start, total), dtype)
        assert out.shape == (new, heads, d) and out.dtype == dtype
        torch.testing.assert_close(out, expected, atol=tol, rtol=tol)


@pytest.fixture
def no_repeated_kv_heads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every way of repeating KV heads (repeat_interleave, expand) fail the test."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("KV heads were repeated")

    monkeypatch.setattr(torch, "repeat_interleave", forbidden)
    monkeypatch.setattr(torch.Tensor, "repeat_interleave", forbidden)
    monkeypatch.setattr(torch.Tensor, "expand", forbidden)


@pytest.mark.usefixtures("no_repeated_kv_heads")
def test_split_prefill_never_repeats_kv_heads() -> None:
    q = torch.randn(5, 6, 8)
    k = torch.randn(9, 2, 8)
    split_prefill_attention(q, k[4:], k[4:].clone(), k[:4], k[:4].clone())


@pytest.mark.parametrize("page", [1, 4, 16])
def test_gather_pages_reads_one_sequence_in_order(page: int) -> None:
    seq = torch.randn(11, 2, 8)
    table = [7, 3, 9, 0, 5, 1, 2, 4, 6, 8, 10][: -(-11 // page)]
    pages = paged(seq, table, 11, page)
    assert torch.equal(gather_pages(pages, torch.tensor(table), 11), seq)


@pytest.mark.parametrize("page", [1, 3, 16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (3, 3)])
def test_batched_decode_over_different_lengths_matches_each_sequence_alone(
    page: int, heads: int, kv_heads: int
) -> None:
    g = torch.Generator().manual_seed(page)
    d, lengths = 8, [1, 9, 17, 4]
    num_blocks = sum(-(-n // page) for n in lengths) + 2
    free = torch.randperm(num_blocks, generator=g).tolist()
    k_pages = torch.randn(num_blocks, page, kv_heads, d, generator=g)
    v_pages = torch.randn(num_blocks, page, kv_heads, d, generator=g)
    tables, seqs = [], []
    for n in lengths:
        table = [free.pop() for _ in range(-(-n // page))]
        tables.append(table)
        seqs.append((gather_pages(k_pages, torch.tensor(table), n), gather_pages(v_pages, torch.tensor(table), n)))
    q = torch.randn(len(lengths), heads, d, generator=g)
    meta = build_decode_meta(tables, lengths, page, torch.device("cpu"))
    out = decode_attention(q, k_pages, v_pages, meta)
    for i, (n, (k, v)) in enumerate(zip(lengths, seqs, strict=True)):
        expected = naive(q[i : i + 1], k, v, torch.tensor([n - 1]))
        torch.testing.assert_close(out[i : i + 1], expected, atol=1e-5, rtol=1e-5)
        single = decode_attention(q[i : i + 1], k_pages, v_pages, build_decode_meta([tables[i]], [n], page, q.device))
        torch.testing.assert_close(single, expected, atol=1e-5, rtol=1e-5)


def test_decode_meta_points_each_new_token_at_its_slot() -> None:
    meta = build_decode_meta([[4, 2], [7]], [6, 1], 4, torch.device("cpu"))
    assert meta.slots.tolist() == [2 * 4 + 1, 7 * 4 + 0]
    assert meta.block_tables.shape == (2, 2)
    assert meta.mask is not None and meta.mask.shape == (2, 1, 1, 8)
    assert meta.mask[1, 0, 0].tolist() == [True] + [False] * 7
    with pytest.raises(ValueError):
        build_decode_meta([[4]], [6], 4, torch.device("cpu"))


@pytest.mark.usefixtures("no_repeated_kv_heads")
def test_gqa_never_repeats_kv_heads() -> None:
    q = torch.randn(5, 6, 8)
    k = torch.randn(5, 2, 8)
    prefill_attention(q, k, k.clone(), causal_mask(0, 5, 5, 3, q.device))
    pages = torch.randn(3, 4, 2, 8)
    decode_attention(q[:2], pages, pages, build_decode_meta([[0, 1], [2]], [6, 3], 4, q.device))


@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (6, 1), (4, 2)])
@pytest.mark.parametrize(("new", "length"), [(1, 5), (7, 130), (64, 496), (33, 1100)])
def test_grouped_prefix_attention_matches_the_kernel_run_head_by_head(
    heads: int, kv_heads: int, new: int, length: int
) -> None:
    """A cached prefix's part of a chunk's attention, run with each KV head's query heads stacked as one block of
    rows, against the same kernel run head by head: the same outputs and log-sum-exps, to float32 rounding (the
    kernel tiles the rows differently; most shapes give the same bits)."""
    g = torch.Generator().manual_seed(heads * 1000 + new + length)
    q = torch.randn(new, heads, 64, generator=g)
    k, v = torch.randn(2, length, kv_heads, 64, generator=g).unbind(0)
    out, lse = attention_module._flash_grouped(q, k, v)
    want_out, want_lse = attention_module._flash(q.transpose(0, 1).unsqueeze(0), k, v, causal=False)
    assert out.shape == want_out.shape == (1, heads, new, 64) and lse.shape == want_lse.shape == (1, heads, new)
    torch.testing.assert_close(out, want_out, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(lse, want_lse, atol=2e-6, rtol=2e-6)
