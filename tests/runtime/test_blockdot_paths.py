"""Every vector path of runtime/native/blockdot.c and decode_attention.c against a float64 reference, not only the
one `-march=native` picks here: the sources are compiled three times with explicit flags (AVX-512, AVX2 + FMA,
portable C) and each build's `blockdot_matmul` must compute `x @ W.T` for dequantised weights of every block kind
(Q4_1 / Q8_0 fused parts; each kind alone and K-quants stacked with the others; 1 to 8 token rows) within float32
summation-order tolerance, give a token row the same bits whatever batch it is in, and refuse arguments out of
range without writing anything; the native RMSNorm and decode attention of the same library against float64 references.
A path whose instructions this CPU lacks is skipped."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

from radixcache.runtime.machine import cpu_fields
from radixcache.runtime.model.block_linear import BlockWeight
from radixcache.runtime.model.dequant import GGML_TYPE_IDS
from radixcache.runtime.native import SOURCE
from radixcache.runtime.testing import random_block_weight
from tests.runtime.loading.kquants import quantize
from tests.runtime.native.random_blocks import KINDS as ALL_KINDS
from tests.runtime.native.random_blocks import random_blocks

CC = os.environ.get("CC", "cc")
# xdist group: one worker runs the module, so each path is compiled once per run, not once per worker that gets
# some of its tests (about 1.5 s of compiler each; the CI run compiled all three twice).
pytestmark = [
    pytest.mark.skipif(shutil.which(CC) is None, reason="no C compiler here"),
    pytest.mark.xdist_group("blockdot_builds"),
]

# name -> (compiler flags, vector width the build reports, CPU flag it needs from /proc/cpuinfo or None)
PATHS = {
    "avx512": (["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"], 16, "avx512f"),
    "avx2": (["-mavx2", "-mfma", "-mf16c", "-mno-avx512f"], 8, "avx2"),
    "portable": (["-mno-avx", "-mno-avx2", "-mno-f16c", "-mno-fma"], 1, None),
}
REL_TO_ABS_SUM = 2e-6  # as tests/runtime/test_block_linear.py: float32 sums in another order than float64


@pytest.fixture(scope="module", params=list(PATHS))
def build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[ctypes.CDLL, int]:
    flags, width, needs = PATHS[request.param]
    if needs is not None and needs not in set(cpu_fields().get("flags", "").split()):
        pytest.skip(f"this CPU has no {needs}: the {request.param} path cannot run here")
    out = tmp_path_factory.mktemp(request.param) / "blockdot.so"
    sources = [str(SOURCE), *(str(SOURCE.with_name(n)) for n in ("decode_attention.c", "paged_attention.c"))]
    cmd = [CC, "-O2", *flags, "-fopenmp", "-shared", "-fPIC", "-std=c11", *sources, "-o", str(out), "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    lib = ctypes.CDLL(str(out))
    ptr, num = ctypes.c_void_p, ctypes.c_int
    lib.blockdot_matmul.argtypes = [num, ptr, ptr, ptr, num, ptr, num, ptr, num]
    lib.blockdot_matmul.restype = num
    lib.blockdot_vector_width.restype = num
    return lib, width


def _matmul(lib: ctypes.CDLL, parts: list[BlockWeight], x: torch.Tensor, ldy: int) -> tuple[int, torch.Tensor]:
    n = len(parts)
    data = (ctypes.c_void_p * n)(*(p.data.data_ptr() for p in parts))
    kind_ids = (ctypes.c_int * n)(*(GGML_TYPE_IDS[p.kind] for p in parts))
    rows = (ctypes.c_int * n)(*(p.rows for p in parts))
    y = torch.full((x.shape[0], ldy), 7.0)
    status = lib.blockdot_matmul(n, data, kind_ids, rows, x.shape[1], x.data_ptr(), x.shape[0], y.data_ptr(), ldy)
    return status, y


def test_the_build_reports_its_vector_path(build: tuple[ctypes.CDLL, int]) -> None:
    lib, width = build
    assert lib.blockdot_vector_width() == width


@pytest.mark.parametrize("ntok", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("layout", [["Q4_1"], ["Q8_0"], ["Q4_1", "Q8_0", "Q4_1"]])
def test_each_path_equals_the_float64_product(build: tuple[ctypes.CDLL, int], layout: list[str], ntok: int) -> None:
    lib, _ = build
    cols = 96
    parts = [random_block_weight(kind, 5 + 3 * i, cols, seed=10 * i + ntok) for i, kind in enumerate(layout)]
    w = torch.cat([p.dequantize() for p in parts]).double()
    x = torch.randn(ntok, cols, generator=torch.Generator().manual_seed(ntok))
    status, y = _matmul(lib, parts, x, w.shape[0])
    assert status == 0
    want = x.double() @ w.T
    bound = REL_TO_ABS_SUM * (x.double().abs() @ w.abs().T)
    assert ((y.double() - want).abs() <= bound).all(), (y.double() - want).abs().max()


# Each kind alone (AVX-512: Q4_1, Q8_0, Q5_0, Q4_K and Q6_K have rows of their own, the others the generic decode),
# and kinds stacked in one call as a Q4_K_M file's fused q/k/v and gate/up matrices are.
KIND_LAYOUTS = [[k] for k in ALL_KINDS] + [["Q4_K", "Q6_K", "Q8_0", "Q5_0"], ["Q5_0", "Q4_1", "Q6_K", "Q5_K"]]


@pytest.mark.parametrize("ntok", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("layout", KIND_LAYOUTS, ids=lambda v: "+".join(v))
def test_each_path_multiplies_every_block_kind(build: tuple[ctypes.CDLL, int], layout: list[str], ntok: int) -> None:
    lib, _ = build
    cols = 512
    parts = [random_blocks(k, 3 + 2 * i, cols, seed=31 * i + ntok) for i, k in enumerate(layout)]
    w = torch.cat([p.dequantize() for p in parts]).double()
    g = torch.Generator().manual_seed(ntok)
    scales = (torch.rand(ntok, cols // 32, generator=g) * 10 + 0.01).repeat_interleave(32, 1)
    x = (torch.randn(ntok, cols, generator=g) * scales).float()  # blocks of very different magnitudes
    status, y = _matmul(lib, parts, x, w.shape[0])
    assert status == 0
    want = x.double() @ w.T
    bound = REL_TO_ABS_SUM * (x.double().abs() @ w.abs().T)
    assert ((y.double() - want).abs() <= bound).all(), (y.double() - want).abs().max()
    for t in range(ntok):  # a row's bits do not depend on the batch it is in (model.linear's promise)
        status, alone = _matmul(lib, parts, x[t : t + 1].contiguous(), w.shape[0])
        assert status == 0 and torch.equal(alone[0], y[t]), t


def _assert_same_bits_on_1_2_3_and_5_threads(lib: ctypes.CDLL, parts: list, x: torch.Tensor, ldy: int) -> None:
    """The product of `parts` with x gives the same bits with teams of 1, 2, 3 and 5 threads (the OpenMP team of
    this thread, as the runtime sizes it)."""
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 3, 5):
            torch.set_num_threads(threads)
            status, y = _matmul(lib, parts, x, ldy)
            assert status == 0
            outs.append(y)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], y) for y in outs[1:])


@pytest.mark.parametrize("ntok", [1, 3, 8])
def test_the_bits_do_not_depend_on_the_thread_count(build: tuple[ctypes.CDLL, int], ntok: int) -> None:
    """Each thread takes one contiguous share of the stacked rows, cut where the parts meet: with 1, 2, 3 and 5
    threads the shares end inside parts and at their edges, and every output row is the same sum."""
    lib, _ = build
    parts = [random_block_weight(kind, n, 64, seed=n) for kind, n in (("Q4_1", 7), ("Q8_0", 5), ("Q4_1", 11))]
    x = torch.randn(ntok, 64, generator=torch.Generator().manual_seed(ntok))
    _assert_same_bits_on_1_2_3_and_5_threads(lib, parts, x, 23)


@pytest.mark.parametrize("ntok", [1, 3, 8])
def test_the_k_quant_rows_bits_do_not_depend_on_the_thread_count(build: tuple[ctypes.CDLL, int], ntok: int) -> None:
    """The same for the rows of kquant_rows.h (and Q5_0's), stacked as a Q4_K_M file's fused matrices are."""
    lib, _ = build
    layout = (("Q4_K", 7), ("Q6_K", 5), ("Q5_K", 3), ("Q5_0", 6))
    parts = [random_blocks(kind, n, 256, seed=n) for kind, n in layout]
    x = torch.randn(ntok, 256, generator=torch.Generator().manual_seed(ntok))
    _assert_same_bits_on_1_2_3_and_5_threads(lib, parts, x, 21)


@pytest.mark.parametrize(
    ("case", "ntok", "cols", "kinds", "ldy"),
    [
        ("no token rows", 0, 64, None, 8),
        ("more token rows than the kernel takes", 9, 64, None, 8),
        ("columns not whole blocks", 2, 48, None, 8),
        ("an unknown block kind", 2, 64, [9], 8),
        ("rows past the output's row stride", 2, 64, None, 3),
    ],
)
def test_arguments_out_of_range_are_refused_and_nothing_is_written(
    build: tuple[ctypes.CDLL, int], case: str, ntok: int, cols: int, kinds: list[int] | None, ldy: int
) -> None:
    lib, _ = build
    part = random_block_weight("Q8_0", 4, 64, seed=1)  # `cols` goes to C on its own: refused before any read
    x = torch.randn(max(ntok, 1), cols)
    n = 1
    data = (ctypes.c_void_p * n)(part.data.data_ptr())
    kind_ids = (ctypes.c_int * n)(*(kinds or [GGML_TYPE_IDS["Q8_0"]]))
    rows = (ctypes.c_int * n)(part.rows)
    y = torch.full((max(ntok, 1), max(ldy, 4)), 7.0)
    status = lib.blockdot_matmul(n, data, kind_ids, rows, cols, x.data_ptr(), ntok, y.data_ptr(), ldy)
    assert status == -1, case
    assert (y == 7.0).all(), case


def _load_ops(lib: ctypes.CDLL) -> None:
    ptr, num = ctypes.c_void_p, ctypes.c_int
    lib.native_rms_norm.argtypes = [ptr, ptr, num, num, ctypes.c_float, ptr]
    lib.native_rms_norm.restype = num
    lib.native_decode_attention.argtypes = [ptr, num, num, num, num, ptr, ptr, ctypes.c_long, ctypes.c_long, ptr]
    lib.native_decode_attention.argtypes += [num, ptr]
    lib.native_decode_attention.restype = num


@pytest.mark.parametrize("rows", [1, 3, 4])
def test_each_path_computes_rms_norm(build: tuple[ctypes.CDLL, int], rows: int) -> None:
    lib, _ = build
    _load_ops(lib)
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 576, generator=g) * 3, torch.randn(576, generator=g)
    out = torch.empty_like(x)
    assert lib.native_rms_norm(x.data_ptr(), w.data_ptr(), rows, 576, 1e-5, out.data_ptr()) == 0
    xd = x.double()
    want = w.double() * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "d", "lengths"),
    [
        (9, 3, 16, [5, 1, 40]),
        (4, 4, 16, [5, 1, 40]),
        (8, 1, 16, [5, 1, 40]),
        (9, 3, 64, [300, 128, 129, 1]),  # SmolLM2's heads; spans of 128 positions: whole, one over, several
        (9, 3, 12, [257, 3]),  # a head size no vector width divides
        (34, 2, 16, [200]),  # a group of 17 query heads: more than one item takes at once (16)
        (10, 2, 64, [15, 16, 17, 33]),  # AVX-512's vector span: 16 scores at once and the rest; outputs 4 + 1 heads
        (34, 2, 64, [200]),  # the vector span with 17 query heads: two slices
        (8, 2, 128, [130, 47]),  # head size 128: the vector span's outputs 2 heads at a time
    ],
)
def test_each_path_computes_decode_attention_over_rows(
    build: tuple[ctypes.CDLL, int], heads: int, kv_heads: int, d: int, lengths: list[int]
) -> None:
    """Rows `[rows, KV, capacity, D]` as the decode mirror holds them, each sequence reading its own length;
    against float64 softmax attention with KV heads repeated in the reference only."""
    lib, _ = build
    _load_ops(lib)
    g = torch.Generator().manual_seed(heads + d)
    batch, cap = len(lengths), max(lengths) + 8
    k = torch.randn(batch + 1, kv_heads, cap, d, generator=g)
    v = torch.randn(batch + 1, kv_heads, cap, d, generator=g)
    q = torch.randn(batch, heads, d, generator=g) * 2  # sharper softmaxes than unit queries give
    out = torch.empty_like(q)
    lens = (ctypes.c_int * batch)(*lengths)
    status = lib.native_decode_attention(
        q.data_ptr(), batch, heads, kv_heads, d, k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), lens, cap,
        out.data_ptr(),
    )  # fmt: skip
    assert status == 0
    for b, n in enumerate(lengths):
        kk = k[b, :, :n].double().repeat_interleave(heads // kv_heads, dim=0)  # [H, n, D]
        vv = v[b, :, :n].double().repeat_interleave(heads // kv_heads, dim=0)
        p = torch.softmax(torch.einsum("hd,hnd->hn", q[b].double(), kk) / d**0.5, dim=-1)
        torch.testing.assert_close(out[b].double(), torch.einsum("hn,hnd->hd", p, vv), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("case", "heads", "kv_heads", "lengths"),
    [
        ("heads not a multiple of KV heads", 5, 2, [3]),
        ("a sequence of no positions", 4, 2, [0]),
        ("a length past the row capacity", 4, 2, [9]),
    ],
)
def test_decode_attention_refuses_bad_arguments_and_writes_nothing(
    build: tuple[ctypes.CDLL, int], case: str, heads: int, kv_heads: int, lengths: list[int]
) -> None:
    lib, _ = build
    _load_ops(lib)
    k = torch.randn(1, kv_heads, 8, 4)
    q = torch.randn(1, heads, 4)
    out = torch.full_like(q, 7.0)
    lens = (ctypes.c_int * 1)(*lengths)
    status = lib.native_decode_attention(
        q.data_ptr(), 1, heads, kv_heads, 4, k.data_ptr(), k.data_ptr(), k.stride(0), k.stride(1), lens, 8,
        out.data_ptr(),
    )  # fmt: skip
    assert status == -1, case
    assert (out == 7.0).all(), case


@pytest.mark.parametrize("ntok", [1, 3, 8])
@pytest.mark.parametrize("kind", ["Q4_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
def test_each_path_multiplies_every_other_kind_as_its_dequantised_weight(
    build: tuple[ctypes.CDLL, int], kind: str, ntok: int
) -> None:
    """The kinds without a hand-written row (their blocks decoded, 16 values at a time with AVX-512), against the
    float64 product with the weight the `gguf`-checked dequantiser reads from the same bytes."""
    lib, _ = build
    rows, cols = 11, 512
    w = np.random.default_rng(ntok).normal(0, 1, (rows, cols)).astype(np.float32)
    part = BlockWeight(kind, torch.from_numpy(quantize(w, kind).reshape(rows, -1).copy()), cols)
    x = torch.randn(ntok, cols, generator=torch.Generator().manual_seed(ntok))
    n = 1
    data = (ctypes.c_void_p * n)(part.data.data_ptr())
    kind_ids = (ctypes.c_int * n)(GGML_TYPE_IDS[kind])
    count = (ctypes.c_int * n)(rows)
    y = torch.full((ntok, rows), 7.0)
    assert lib.blockdot_matmul(n, data, kind_ids, count, cols, x.data_ptr(), ntok, y.data_ptr(), rows) == 0
    dense = part.dequantize().double()
    want = x.double() @ dense.T
    bound = REL_TO_ABS_SUM * (x.double().abs() @ dense.abs().T)
    assert ((y.double() - want).abs() <= bound).all(), (y.double() - want).abs().max()
