"""Decode of one sequence reads its pages in place: `page_runs` groups the table into views of the pool, and
attention over those views (merged by log-sum-exp) equals plain attention over the sequence, for every
shape of table the allocator can produce: contiguous, reversed, split in a few pieces, or too scattered (the
gather path then runs)."""

from __future__ import annotations

import math

import pytest
import torch

from radixcache.runtime.model.attention import MAX_RUNS, build_decode_meta, decode_attention, page_runs

CPU = torch.device("cpu")


def naive_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [1, H, D] over k/v [S, KV, D] (all keys visible), float64 with repeated KV heads."""
    h, kvh = q.shape[1], k.shape[1]
    k = k.double().repeat_interleave(h // kvh, dim=1)
    v = v.double().repeat_interleave(h // kvh, dim=1)
    scores = torch.einsum("thd,shd->hts", q.double(), k) / math.sqrt(q.shape[-1])
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v).float()


def sequence(pages: torch.Tensor, table: list[int], length: int) -> torch.Tensor:
    """Positions 0 .. length-1 read one by one through the table (independent of page_runs)."""
    p = pages.shape[1]
    return torch.stack([pages[table[i // p], i % p] for i in range(length)])


def test_contiguous_pages_are_one_run_and_the_partial_page_its_own() -> None:
    assert page_runs([4, 5, 6], 40, 16) == ((4, 2, 32), (6, 1, 8))
    assert page_runs([4, 5, 6], 48, 16) == ((4, 3, 48),)
    assert page_runs([9], 3, 16) == ((9, 1, 3),)


def test_order_does_not_matter_for_full_pages() -> None:
    """Pages popped from the free stack come out in descending order: still one run."""
    assert page_runs([12, 11, 10, 2], 60, 16) == ((10, 3, 48), (2, 1, 12))
    assert page_runs([7, 3, 8, 4], 64, 16) == ((3, 2, 32), (7, 2, 32))


def test_too_many_runs_fall_back_to_the_gather_path() -> None:
    scattered = [0, 2, 4, 6, 8, 10]
    assert page_runs(scattered[:MAX_RUNS], MAX_RUNS * 16, 16) is not None
    assert page_runs(scattered, 6 * 16, 16) is None
    meta = build_decode_meta([scattered], [6 * 16], 16, CPU)
    assert meta.runs is None


def test_a_batch_never_uses_runs() -> None:
    meta = build_decode_meta([[0, 1], [2, 3]], [20, 30], 16, CPU)
    assert meta.runs is None


TABLES = {
    "contiguous": [3, 4, 5, 6, 7],
    "reversed": [7, 6, 5, 4, 3],
    "two pieces": [10, 11, 2, 3, 4],
    "four pieces, partial page alone": [20, 1, 14, 8, 9],
    "scattered (gather path)": [0, 5, 10, 15, 20],
}


@pytest.mark.parametrize("page", [1, 5, 16])
@pytest.mark.parametrize("shape", sorted(TABLES))
@pytest.mark.parametrize("fill", [1, 0], ids=["partial last page", "full last page"])
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4)])
def test_decode_over_runs_equals_attention_over_the_sequence(
    page: int, shape: str, fill: int, heads: int, kv_heads: int
) -> None:
    g = torch.Generator().manual_seed(page * 31 + len(shape))
    table = TABLES[shape]
    length = (len(table) - 1) * page + (fill if page > 1 else 1)
    num_blocks, d = 24, 8
    k_pages = torch.randn(num_blocks, page, kv_heads, d, generator=g)  # other blocks hold garbage
    v_pages = torch.randn(num_blocks, page, kv_heads, d, generator=g)
    q = torch.randn(1, heads, d, generator=g)
    meta = build_decode_meta([table], [length], page, CPU)
    want = naive_decode(q, sequence(k_pages, table, length), sequence(v_pages, table, length))
    got = decode_attention(q, k_pages, v_pages, meta)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if meta.runs is not None:  # and it agrees with the gather path on the same table
        gathered = decode_attention(q, k_pages, v_pages, meta.without_runs())
        torch.testing.assert_close(got, gathered, atol=1e-5, rtol=1e-5)


def test_the_run_path_copies_no_kv(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading in place means no index_select of the pages (the gather path's copy)."""
    k_pages, v_pages = torch.randn(16, 4, 2, 8), torch.randn(16, 4, 2, 8)
    meta = build_decode_meta([[2, 3, 4, 9]], [14], 4, CPU)
    assert meta.runs == ((2, 3, 12), (9, 1, 2))

    def forbidden(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("the run path gathered pages")

    monkeypatch.setattr(torch.Tensor, "index_select", forbidden)
    decode_attention(torch.randn(1, 4, 8), k_pages, v_pages, meta)


def test_bfloat16_comes_back_in_bfloat16() -> None:
    k_pages = torch.randn(8, 4, 1, 8).bfloat16()
    v_pages = torch.randn(8, 4, 1, 8).bfloat16()
    meta = build_decode_meta([[1, 2, 5]], [10], 4, CPU)
    assert meta.runs is not None and len(meta.runs) == 2
    out = decode_attention(torch.randn(1, 2, 8).bfloat16(), k_pages, v_pages, meta)
    assert out.dtype == torch.bfloat16
