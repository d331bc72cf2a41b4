"""runtime/native/row_argmax.c: each row's greedy token, against numpy's argmax and the finiteness check that
runtime/engine/output.py's greedy_tokens applies (the first index of the maximum; -1 where the maximum is not
finite: a NaN anywhere, +inf or an all -inf row), on 1 to 5 threads, for rows shorter than a vector, rows whose
maximum repeats across the threads' parts, and a SmolLM2-wide row."""

from __future__ import annotations

import ctypes
import math
import os
import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime.native import blockdot

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the native kernels need a C compiler"
)


def native_best(x: torch.Tensor, threads: int) -> list[int]:
    rows, cols = x.shape
    best = (ctypes.c_long * max(rows, 1))()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert blockdot().native_row_argmax(x.contiguous().data_ptr(), rows, cols, best) == 0
    finally:
        torch.set_num_threads(before)
    return list(best)[:rows]


def numpy_best(x: torch.Tensor) -> list[int]:
    """greedy_tokens' answer per row (numpy argmax, then the finiteness check), -1 for its None."""
    out = []
    for row in x.numpy():
        i = int(row.argmax())
        out.append(i if math.isfinite(row[i]) else -1)
    return out


VALUES = st.sampled_from([0.0, 1.0, -1.0, 2.5, 2.5, -3.0, 1e30, -1e30, 7.0])  # few values: the maximum repeats
SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf])


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(1, 3),
    cols=st.integers(1, 130),
    threads=st.integers(1, 5),
    data=st.data(),
)
def test_matches_numpy_argmax_and_the_finiteness_check(rows: int, cols: int, threads: int, data: st.DataObject) -> None:
    values = data.draw(st.lists(VALUES, min_size=rows * cols, max_size=rows * cols))
    x = torch.tensor(values, dtype=torch.float32).view(rows, cols)
    for _ in range(data.draw(st.integers(0, 3))):  # a NaN, an infinity or -inf somewhere
        x.view(-1)[data.draw(st.integers(0, rows * cols - 1))] = data.draw(SPECIAL)
    assert native_best(x, threads) == numpy_best(x)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_smollm2_row_whose_maximum_repeats_in_both_parts(threads: int) -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 49_152, generator=g)
    x[0, 40_000] = x[0, 30_000] = 9.0  # both in the second thread's part: the earlier wins
    x[1, 24_575] = x[1, 24_576] = x[1, 49_151] = 9.0  # the last of the first part, the first of the second
    assert native_best(x, threads) == numpy_best(x) == [30_000, 24_575]
    x[1, 100] = math.inf
    assert native_best(x, threads) == [30_000, -1]
    x[0, 49_151] = math.nan
    assert native_best(x, threads) == [-1, -1]


def test_all_minus_infinity_and_huge_rows() -> None:
    x = torch.full((1, 77), -math.inf)
    assert native_best(x, 2) == [-1]  # numpy's 0, whose value is not finite
    x = torch.full((1, 77), np.finfo(np.float32).max)
    assert native_best(x, 2) == [0]


def test_refuses_arguments_out_of_range() -> None:
    best = (ctypes.c_long * 1)()
    x = torch.zeros(1, 4)
    assert blockdot().native_row_argmax(x.data_ptr(), -1, 4, best) == -1
    assert blockdot().native_row_argmax(x.data_ptr(), 1, 0, best) == -1
