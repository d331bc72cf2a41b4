"""Pages copied in runs (runtime.kv.tier.page_copy) land exactly where a naive page-by-page copy puts them."""

from __future__ import annotations

import random

import pytest
import torch

from radixcache.runtime.kv.tier.page_copy import copy_pages, page_runs


def test_runs_split_where_either_side_jumps() -> None:
    assert page_runs([3, 4, 5, 9, 10], [0, 1, 7, 8, 9]) == [(3, 0, 2), (5, 7, 1), (9, 8, 2)]
    assert page_runs([], []) == []
    with pytest.raises(ValueError, match="2 source pages for 1"):
        page_runs([0, 1], [0])


@pytest.mark.parametrize("seed", range(20))
def test_copy_in_runs_equals_a_page_by_page_copy(seed: int) -> None:
    rng = random.Random(seed)
    src = torch.randn(2, 2, 12, 3, 2, 4)
    n = rng.randrange(0, 10)
    src_pages = sorted(rng.sample(range(12), n)) if rng.random() < 0.5 else rng.sample(range(12), n)
    dst_pages = rng.sample(range(16), n)
    if rng.random() < 0.5:  # mostly consecutive, as a pool hands them out
        start = rng.randrange(0, 16 - n + 1)
        dst_pages = list(range(start, start + n))
    want = torch.zeros(2, 2, 16, 3, 2, 4)
    for s, d in zip(src_pages, dst_pages, strict=True):
        want[:, :, d] = src[:, :, s]
    got = torch.zeros_like(want)
    copy_pages(got, dst_pages, src, src_pages)
    assert torch.equal(got, want)
