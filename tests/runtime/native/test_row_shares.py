"""runtime/native/thread_rows.h: the shares the threads of a product take rows from (densedot.c, blockdot.c, qdot.c).
Whatever the rows, shares, team size, claim size and delays, every row is taken exactly once (against a count kept
per row); a thread held back has rows of its share taken by the others; a team smaller than the shares leaves no
row behind; and through the real products, a weight whose rows are shared unevenly gives the same bits as one
thread alone."""

from __future__ import annotations

import ctypes
import os
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime.native import blockdot

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the native kernels need a C compiler"
)


def run_shares(total: int, count: int, threads: int, chunk: int, slow: int = -1, slow_us: int = 0):
    """(threads that ran, per-row claim counts, rows taken from another thread's share)."""
    counts = torch.zeros(max(total, 1), dtype=torch.int32)
    taken = ctypes.c_long(0)
    ran = blockdot().native_row_shares_check(
        total, count, threads, chunk, slow, slow_us, counts.data_ptr(), ctypes.byref(taken)
    )
    return ran, counts[:total], taken.value


@settings(max_examples=60, deadline=None)
@given(
    total=st.integers(0, 3000),
    count=st.integers(1, 6),
    threads=st.integers(1, 6),
    chunk=st.integers(1, 400),
    slow=st.integers(-1, 5),
    slow_us=st.sampled_from([0, 50, 500]),
)
def test_every_row_is_taken_exactly_once(
    total: int, count: int, threads: int, chunk: int, slow: int, slow_us: int
) -> None:
    ran, counts, _ = run_shares(total, count, threads, chunk, slow, slow_us)
    assert 1 <= ran <= threads
    assert bool((counts == 1).all()), (counts != 1).nonzero().flatten()[:10].tolist()


def test_a_thread_held_back_has_rows_of_its_share_taken_by_the_other() -> None:
    ran, counts, taken = run_shares(20_000, 2, 2, 16, slow=0, slow_us=100_000)  # 0.1 s: far past the other's share
    if ran < 2:
        pytest.skip("OpenMP ran one thread here")
    assert bool((counts == 1).all())
    assert taken > 0


def test_shares_without_a_thread_of_their_own_are_taken_by_the_others() -> None:
    ran, counts, taken = run_shares(1000, 5, 1, 7)  # one thread, five shares: four are someone else's
    assert ran == 1
    assert bool((counts == 1).all())
    assert taken == 1000 - 1000 // 5


def expected_claims(total: int, chunk: int, from_back: bool) -> list[int]:
    """thread_rows.h's rule, restated: the owner takes `chunk` rows, or a quarter of what is left once that is
    less; a thief half of what is left; never under chunk // 8 (one at least) nor over what is left."""
    sizes, left, least = [], total, max(chunk // 8, 1)
    while left > 0:
        take = left // 2 if from_back else min(left // 4, chunk)
        take = min(max(take, least), left)
        sizes.append(take)
        left -= take
    return sizes


@settings(max_examples=80, deadline=None)
@given(total=st.integers(0, 5000), chunk=st.integers(1, 300), from_back=st.booleans())
def test_claims_shrink_as_a_share_runs_out(total: int, chunk: int, from_back: bool) -> None:
    cap = 5000
    sizes = (ctypes.c_int * cap)()
    n = blockdot().native_row_claims_check(total, chunk, int(from_back), sizes, cap)
    assert list(sizes[:n]) == expected_claims(total, chunk, from_back)


def test_the_owner_ends_its_share_in_small_claims() -> None:
    sizes = (ctypes.c_int * 64)()
    n = blockdot().native_row_claims_check(1000, 100, 0, sizes, 64)
    # full chunks while a quarter of the rest is a chunk or more, then quarters, then the floor of 12 rows
    assert list(sizes[:n]) == [100] * 7 + [75, 56, 42, 31, 24, 18, 13, 12, 12, 12, 5]
    assert sum(sizes[:n]) == 1000


def test_refuses_arguments_out_of_range() -> None:
    for args in ((-1, 2, 2, 4), (10, 0, 2, 4), (10, 2, 0, 4), (10, 2, 2, 0)):
        assert run_shares(*args)[0] == -1


def test_products_give_the_same_bits_when_one_thread_is_slow() -> None:
    """Four threads on this machine's cores (2 in CI): they are descheduled at random, so rows move between threads
    from one call to the next; the float32 product and the Q8_0 ones (float and int8 activations) keep one
    thread's bits."""
    lib = blockdot()
    g = torch.Generator().manual_seed(3)
    w = torch.randn(3000, 64, generator=g)
    x = torch.randn(2, 64, generator=g)
    q8 = torch.zeros(3000, 2, 34, dtype=torch.uint8)  # Q8_0 blocks: a float16 scale, then 32 int8 values
    q8[:, :, :2] = torch.full((3000, 2), 0.01, dtype=torch.float16).view(torch.uint8).view(3000, 2, 2)
    q8[:, :, 2:] = torch.randint(0, 256, (3000, 2, 32), generator=g, dtype=torch.uint8)

    def product(fn, data: torch.Tensor, kind: int) -> torch.Tensor:
        y = torch.empty(2, 3000)
        ptrs = (ctypes.c_void_p * 1)(data.data_ptr())
        kinds, rows = (ctypes.c_int * 1)(kind), (ctypes.c_int * 1)(3000)
        assert fn(1, ptrs, kinds, rows, 64, x.data_ptr(), 2, y.data_ptr(), 3000) == 0
        return y

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        calls = ((lib.densedot_matmul, w, 0), (lib.blockdot_matmul, q8, 8), (lib.qdot_matmul, q8, 8))
        want = [product(*call) for call in calls]
        torch.set_num_threads(4)
        for _ in range(20):
            for call, expected in zip(calls, want, strict=True):
                assert torch.equal(product(*call), expected)
    finally:
        torch.set_num_threads(before)
