"""A decode mirror row filled from the pool in one native call (runtime/native/mirror_fill.c through
`NativeDecodeOps.fill_mirror`, used by `DecodeMirror._load` for float32 on the CPU): the row holds exactly what
the pool holds at each position, read slot by slot (the independent reference), on 1 and 2 threads, for lengths
inside one page, at a page's end and across pages in shuffled order, and equals the PyTorch fill's row; bad page
ids, rows and lengths are refused with nothing written; other dtypes are declined (the caller's copy runs)."""

from __future__ import annotations

import random

import pytest
import torch

from radixcache.runtime.kv.mirror import DecodeMirror
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.native.ops import NativeDecodeOps
from radixcache.runtime.testing import tiny_config
from tests.runtime.engine.mirror_twin import read_sequence

PAGE = 4
BLOCKS = 24
CONFIG = tiny_config()


@pytest.fixture(scope="module")
def native() -> NativeDecodeOps:
    return NativeDecodeOps()


def random_pool(seed: int, dtype: torch.dtype = torch.float32) -> KVPool:
    pool = KVPool(CONFIG, BLOCKS, PAGE, dtype=dtype)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return pool


def shuffled_table(n: int, seed: int) -> list[int]:
    pages = list(range(BLOCKS))
    random.Random(seed).shuffle(pages)
    return pages[: -(-n // PAGE) + 1]  # one page more than the positions need, as a growing sequence's table has


class CountingOps(NativeDecodeOps):
    """The real native ops, counting the fills that ran natively."""

    def __init__(self) -> None:
        super().__init__()
        self.fills = 0

    def fill_mirror(self, *args: object, **kwargs: object) -> bool:
        done = super().fill_mirror(*args, **kwargs)  # type: ignore[arg-type]
        self.fills += done
        return done


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [1, 3, PAGE, PAGE + 1, 37])
def test_a_native_fill_holds_what_the_pool_holds_and_equals_the_torch_fill(n: int, threads: int) -> None:
    pool = random_pool(seed=n)
    table = shuffled_table(n, seed=n)
    ops = CountingOps()
    mirrors = {
        name: DecodeMirror(CONFIG, torch.float32, "cpu", 1 << 24, native=o)
        for name, o in (("native", ops), ("torch", None))
    }
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for m in mirrors.values():  # a second sequence first, so the filled row is row 1, not row 0
            m.prepare(["other", "seq"], [shuffled_table(5, seed=99), table], [6, n + 1], pool)
    finally:
        torch.set_num_threads(before)
    assert ops.fills == 2, "both rows were filled by the native call"
    native, torch_filled = mirrors["native"], mirrors["torch"]
    for layer in range(CONFIG.num_layers):
        want_k, want_v = read_sequence(pool, layer, table, n)  # [n, kv_heads, head_dim], slot by slot
        row_k, row_v = native._k[layer][1], native._v[layer][1]  # [kv_heads, capacity, head_dim]
        assert torch.equal(row_k[:, :n].transpose(0, 1), want_k) and torch.equal(row_v[:, :n].transpose(0, 1), want_v)
        assert not row_k[:, n:].any() and not row_v[:, n:].any(), "positions past the sequence stay zero"
        assert torch.equal(native._k[layer], torch_filled._k[layer])
        assert torch.equal(native._v[layer], torch_filled._v[layer])
    assert native.positions_loaded == torch_filled.positions_loaded == 5 + n


def mirror_rows(layers: int = CONFIG.num_layers, rows: int = 2, capacity: int = 64) -> tuple[list, list]:
    shape = (rows, CONFIG.num_kv_heads, capacity, CONFIG.head_dim)
    return [torch.full(shape, 7.0) for _ in range(layers)], [torch.full(shape, 7.0) for _ in range(layers)]


@pytest.mark.parametrize(
    ("table", "row", "n", "match"),
    [
        ([0, BLOCKS], 0, PAGE + 1, "pages"),  # a page id past the pool
        ([0, -1], 0, PAGE + 1, "pages"),  # a negative page id
        ([0], 0, PAGE + 1, "pages"),  # fewer pages than the positions need
        ([0] * 20, 0, 65, "positions"),  # more positions than the capacity
        ([0], 2, 1, "row 2"),  # a row past the mirror's
        ([0], -1, 1, "row -1"),
    ],
)
def test_bad_pages_rows_and_lengths_are_refused_and_nothing_is_written(
    native: NativeDecodeOps, table: list[int], row: int, n: int, match: str
) -> None:
    pool = random_pool(seed=1)
    k, v = mirror_rows()
    with pytest.raises(ValueError, match=match):
        native.fill_mirror(pool.kv, k, v, row, table, n, threads=2)
    assert all(bool((t == 7.0).all()) for t in (*k, *v)), "a refused fill wrote nothing"


def test_other_dtypes_and_shapes_are_declined_for_the_callers_copy(native: NativeDecodeOps) -> None:
    pool64 = random_pool(seed=2, dtype=torch.float64)
    k, v = mirror_rows()
    assert native.fill_mirror(pool64.kv, [t.double() for t in k], [t.double() for t in v], 0, [0], 1, 1) is False
    pool = random_pool(seed=2)
    assert native.fill_mirror(pool.kv, k[:1], v[:1], 0, [0], 1, 1) is False  # a layer count that is not the pool's
    wide = [torch.zeros(2, CONFIG.num_kv_heads + 1, 64, CONFIG.head_dim) for _ in k]
    assert native.fill_mirror(pool.kv, wide, wide, 0, [0], 1, 1) is False  # other head counts
    assert all(bool((t == 7.0).all()) for t in (*k, *v))
    # and the mirror then copies them itself: a float64 model's row still holds the pool's K/V
    mirror = DecodeMirror(CONFIG, torch.float64, "cpu", 1 << 24, native=native)
    table = shuffled_table(9, seed=3)
    mirror.prepare(["s"], [table], [10], pool64)
    want_k, _ = read_sequence(pool64, 0, table, 9)
    assert torch.equal(mirror._k[0][0, :, :9].transpose(0, 1), want_k)
