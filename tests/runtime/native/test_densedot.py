"""runtime/native/densedot.c (the float32 model's native decode product) on every vector path this CPU can run:
for 1 to 8 rows of x, weights of one or several stacked parts and widths with and without a tail past the last
vector, y equals the float64 product within float32 summation error; the bits do not depend on the thread count;
arguments out of range (0 or 9 rows, a kind other than F32, rows past the output stride) are refused with -1 and
nothing written. Through the library the runtime loads: DenseLinear's "native" path, in chunks of 8 past 8 rows."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import pytest
import torch

from radixcache.runtime.machine import cpu_fields
from radixcache.runtime.model.linear import DenseLinear
from radixcache.runtime.native import SOURCES

CC = os.environ.get("CC", "cc")
# xdist group: one worker runs the module, so each path is compiled once per run, not once per worker that gets
# some of its tests (as test_qdot and test_blockdot_paths).
pytestmark = [
    pytest.mark.skipif(shutil.which(CC) is None, reason="no C compiler here"),
    pytest.mark.xdist_group("densedot_builds"),
]

# name -> (compiler flags, CPU flags it needs)
PATHS = {
    "native": (["-march=native"], ()),
    "avx2": (["-mavx2", "-mfma", "-mno-avx512f"], ("avx2", "fma")),
    "portable": (["-march=x86-64", "-mno-avx", "-mno-avx2", "-mno-fma"], ()),
}
# float32 products of n terms against float64: ~sqrt(n) * 6e-8 relative; 1e-5 (of sum |w x|) is far above that
# and far below a wrong term.
SLACK = 1e-5
KIND_F32, KIND_Q8_0 = 0, 8


@pytest.fixture(scope="module", params=list(PATHS))
def lib(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    flags, needs = PATHS[request.param]
    have = set(cpu_fields().get("flags", "").split())
    if any(f not in have for f in needs):
        pytest.skip(f"this CPU lacks {needs}")
    source = next(s for s in SOURCES if s.name == "densedot.c")
    out = tmp_path_factory.mktemp("densedot") / f"densedot-{request.param}.so"
    cmd = [CC, "-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11", *flags, str(source), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"{request.param} does not build here: {proc.stderr[-300:]}")
    built = ctypes.CDLL(str(out))
    p, n = ctypes.c_void_p, ctypes.c_int
    built.densedot_matmul.argtypes = [n, p, p, p, n, p, n, p, n]
    built.densedot_matmul.restype = ctypes.c_int
    return built


def _call(lib: ctypes.CDLL, parts: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, kinds=None) -> int:
    n = len(parts)
    data = (ctypes.c_void_p * n)(*(w.data_ptr() for w in parts))
    kind = (ctypes.c_int * n)(*(kinds or [KIND_F32] * n))
    rows = (ctypes.c_int * n)(*(w.shape[0] for w in parts))
    cols = parts[0].shape[1]
    return lib.densedot_matmul(n, data, kind, rows, cols, x.data_ptr(), x.shape[0], y.data_ptr(), y.shape[1])


@pytest.mark.parametrize("cols", [576, 40, 7])  # whole vectors; 2 vectors of 16 and a tail of 8; a tail only
@pytest.mark.parametrize("split", [(96,), (64, 16, 16)], ids=["one part", "three parts"])
def test_products_match_float64_for_1_to_8_rows(lib: ctypes.CDLL, cols: int, split: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(cols + len(split))
    parts = [torch.randn(r, cols, generator=g) for r in split]
    w = torch.cat(parts)
    for ntok in range(1, 9):
        x = torch.randn(ntok, cols, generator=g)
        y = torch.full((ntok, w.shape[0]), float("nan"))
        assert _call(lib, parts, x, y) == 0
        want = x.double() @ w.double().T
        bound = SLACK * (x.double().abs() @ w.double().abs().T)
        assert ((y.double() - want).abs() <= bound).all(), (ntok, (y.double() - want).abs().max().item())


def test_the_bits_do_not_depend_on_the_thread_count(lib: ctypes.CDLL) -> None:
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(1000, 576, generator=g), torch.randn(3, 576, generator=g)
    outs = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)  # the OpenMP team of this thread, as the runtime sizes it
            y = torch.empty(3, 1000)
            assert _call(lib, [w], x, y) == 0
            outs.append(y)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], y) for y in outs[1:])


def test_arguments_out_of_range_are_refused_and_nothing_is_written(lib: ctypes.CDLL) -> None:
    w = torch.randn(8, 32)
    for ntok in (0, 9):
        x = torch.randn(max(ntok, 1), 32)
        y = torch.full((max(ntok, 1), 8), 7.0)
        data = (ctypes.c_void_p * 1)(w.data_ptr())
        kinds, rows = (ctypes.c_int * 1)(KIND_F32), (ctypes.c_int * 1)(8)
        assert lib.densedot_matmul(1, data, kinds, rows, 32, x.data_ptr(), ntok, y.data_ptr(), 8) == -1
        assert (y == 7.0).all()
    x, y = torch.randn(1, 32), torch.full((1, 8), 7.0)
    assert _call(lib, [w], x, y, kinds=[KIND_Q8_0]) == -1  # block kinds are blockdot.c's
    assert _call(lib, [w], x, torch.full((1, 4), 7.0)) == -1  # 8 output rows past a stride of 4
    assert _call(lib, [w[:, :0].contiguous()], torch.randn(1, 1), y) == -1  # no columns
    assert (y == 7.0).all()


def test_dense_linear_native_path_matches_float64_past_eight_rows() -> None:
    g = torch.Generator().manual_seed(2)
    w, b = torch.randn(48, 80, generator=g), torch.randn(48, generator=g)
    layer = DenseLinear(w, b)
    if not layer.can_run("native"):
        pytest.skip("the native library does not build here")
    for rows in (1, 8, 9, 20):  # 9 and 20 rows: chunks of 8, then the rest
        x = torch.randn(rows, 80, generator=g)
        got = layer.run("native", x)
        want = x.double() @ w.double().T + b.double()
        bound = SLACK * (x.double().abs() @ w.double().abs().T + b.double().abs())
        assert got.shape == (rows, 48) and ((got.double() - want).abs() <= bound).all(), rows
    with pytest.raises(ValueError, match="float32 CPU rows"):
        layer.run("native", torch.randn(2, 81))
    assert not DenseLinear(w.double()).can_run("native")  # float64: the path does not run
