"""runtime/native/qdot.c (int8 and 16-bit activations) on every vector path this CPU can run, and BlockLinear's
kernel choice.

Each build of qdot.c (AVX-512 VNNI from -march=native, AVX-VNNI, AVX2, portable C; a path whose instructions this
CPU lacks is compiled, unoptimised, and skipped; each linked with blockdot.c's argument check, compiled once) must
give, for each block kind, 1 to 8 token rows and both widths (qdot_matmul: int8, top 127; qdot16_matmul: 16-bit,
top 32639):
- the product of the dequantised weight with the activations as this test quantises them itself (numpy, float32:
  per 32 values d = max|x| / top, q = round-half-even(x / d)), within float32 summation slack: so the kernel really
  uses one scale per 32 values per row, and integer sums;
- the float64 product of the unquantised activations within the rounding bound: sum over blocks of
  d / 2 * sum |w| (half a step per activation), plus the same slack;
- at the integer extremes (every weight and activation at its largest magnitude, both signs), the exact product:
  no int16 pair sum saturates and no int32 lane overflows.
Arguments out of range (token rows 0 or 9, columns not whole blocks of the kind, an unknown kind, rows past the
output stride) are refused with -1 and nothing written. BlockLinear: "float", "int16" and "int8" each run their
kernel in every pass, "int16-decode" (the default) and "int8-decode" run theirs in decode passes and float in a
pure prefill pass,
"auto" keeps one per signature and token count, the environment variable forces one, an unknown value is refused.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

from radixcache.runtime.machine import cpu_fields
from radixcache.runtime.model.block_linear import (
    BLOCK_BYTES,
    BLOCK_ELEMS,
    BlockLinear,
    BlockWeight,
    activation_choices,
)
from radixcache.runtime.model.dequant import GGML_TYPE_IDS
from radixcache.runtime.native import HEADERS, SOURCES
from tests.runtime.loading.kquants import INT16_TOP, quantised_activations
from tests.runtime.native.random_blocks import HALF_FIELDS, KINDS, random_blocks

CC = os.environ.get("CC", "cc")
# xdist group: one worker runs the module, so each path is compiled once per run, not once per worker that gets
# some of its tests (about 2 s of compiler each).
pytestmark = [
    pytest.mark.skipif(shutil.which(CC) is None, reason="no C compiler here"),
    pytest.mark.xdist_group("qdot_builds"),
]

# name -> (compiler flags, qdot_path() the build reports, CPU flags it needs)
PATHS = {
    "vnni512": (["-march=native"], 3, ("avx512_vnni", "avx512vl")),
    "avxvnni": (["-mavx2", "-mfma", "-mf16c", "-mavxvnni", "-mno-avx512f"], 2, ("avx_vnni",)),
    "avx2": (["-mavx2", "-mfma", "-mf16c", "-mno-avx512f"], 1, ("avx2", "fma")),
    "portable": (["-march=x86-64", "-mno-avx", "-mno-avx2", "-mno-f16c", "-mno-fma"], 0, ()),
}
SLACK = 1e-5  # float32 scale products and block sums in another order than float64, relative to sum |x w|


INCLUDE = f"-I{HEADERS[0].parent}"
COMMON = ["-O2", INCLUDE, "-fopenmp", "-fPIC", "-std=c11"]


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> str:
    """blockdot.c compiled once, with the portable path's flags: qdot.c takes only its argument check from it
    (blockdot_check_parts, scalar code), and blockdot.c's own vector paths are test_blockdot_paths.py's. Built for
    each path with that path's flags, it was about 5 s of compiler per path for the same check."""
    out = tmp_path_factory.mktemp("checks") / "blockdot.o"
    source = next(str(s) for s in SOURCES if s.name == "blockdot.c")
    cmd = [CC, *COMMON, *PATHS["portable"][0], "-c", source, "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return str(out)


@pytest.fixture(scope="module", params=list(PATHS))
def lib(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, checks: str) -> ctypes.CDLL:
    flags, path, needs = PATHS[request.param]
    out = tmp_path_factory.mktemp(request.param) / "qdot.so"
    source = next(str(s) for s in SOURCES if s.name == "qdot.c")
    missing = [f for f in needs if f not in set(cpu_fields().get("flags", "").split())]
    if missing:  # it must still compile for its instructions; unoptimised, as nothing here runs it (2 s less each)
        cmd = [CC, "-O0", *flags, *COMMON[1:], "-c", source, "-o", str(out.with_suffix(".o"))]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        pytest.skip(f"this CPU has no {', '.join(missing)}: the {request.param} path cannot run here")
    cmd = [CC, *COMMON[:1], *flags, *COMMON[1:], "-shared", source, checks, "-o", str(out)]  # qdot.c + the check
    proc = subprocess.run([*cmd, "-lm"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    built = ctypes.CDLL(str(out))
    built.qdot_matmul.argtypes = [ctypes.c_int, *[ctypes.c_void_p] * 3, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    built.qdot_matmul.argtypes += [ctypes.c_void_p, ctypes.c_int]
    built.qdot_matmul.restype = built.qdot_path.restype = ctypes.c_int
    built.qdot16_matmul.argtypes, built.qdot16_matmul.restype = built.qdot_matmul.argtypes, ctypes.c_int
    assert built.qdot_path() == path
    return built


# width -> (kernel, the activations' largest integer)
WIDTHS = {"int8": ("qdot_matmul", 127), "int16": ("qdot16_matmul", INT16_TOP)}


def qdot(
    lib: ctypes.CDLL, parts: list[BlockWeight], x: torch.Tensor, ldy: int, cols: int | None = None, width: str = "int8"
) -> tuple:
    n = len(parts)
    data = (ctypes.c_void_p * n)(*(p.data.data_ptr() for p in parts))
    kinds = (ctypes.c_int * n)(*(GGML_TYPE_IDS[p.kind] for p in parts))
    rows = (ctypes.c_int * n)(*(p.rows for p in parts))
    y = torch.full((max(x.shape[0], 1), ldy), 7.0)
    cols = x.shape[1] if cols is None else cols
    kernel = getattr(lib, WIDTHS[width][0])
    return kernel(n, data, kinds, rows, cols, x.data_ptr(), x.shape[0], y.data_ptr(), ldy), y


# ["Q4_1", "Q4_1"] (3 + 5 rows): output rows 0-3 straddle the parts (row by row), 4-7 lie in one (the four-row
# Q4_1 path at one token)
LAYOUTS = [[k] for k in KINDS] + [["Q4_K", "Q6_K", "Q8_0", "Q4_1"], ["Q4_1", "Q4_1"]]


@pytest.mark.parametrize("width", list(WIDTHS))
@pytest.mark.parametrize("ntok", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda v: "+".join(v))
def test_quantised_products_match_both_references(lib: ctypes.CDLL, layout: list[str], ntok: int, width: str) -> None:
    cols = 512
    parts = [random_blocks(k, 3 + 2 * i, cols, seed=17 * i + ntok) for i, k in enumerate(layout)]
    w = np.concatenate([p.dequantize().numpy() for p in parts]).astype(np.float64)
    rng = np.random.default_rng(ntok)
    scales = rng.uniform(0.01, 10, (ntok, cols // 32)).repeat(32, 1)  # blocks of very different magnitudes
    x = (rng.normal(0, 1, (ntok, cols)) * scales).astype(np.float32)
    x[0, 64:96] = 0.0  # an all-zero block: scale 0, no division by it
    status, y = qdot(lib, parts, torch.from_numpy(x), w.shape[0], width=width)
    assert status == 0
    got = y.numpy().astype(np.float64)
    seen, half_step = quantised_activations(x, WIDTHS[width][1])
    slack = SLACK * (np.abs(seen) @ np.abs(w).T) + 1e-30
    assert (np.abs(got - seen @ w.T) <= slack).all(), np.abs(got - seen @ w.T).max()
    exact = x.astype(np.float64) @ w.T
    bound = half_step @ np.abs(w).T + slack
    assert (np.abs(got - exact) <= bound).all()
    # the activations really were quantised: the kernel is nearer the rounded product than the exact one
    assert 10 * np.abs(got - seen @ w.T).max() < np.abs(got - exact).max()


@pytest.mark.parametrize("width", list(WIDTHS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_rows_bits_do_not_depend_on_how_many_tokens_share_the_call(lib: ctypes.CDLL, kind: str, width: str) -> None:
    """One token takes other instructions than 2 or more (16-bit K-quants: the activations' planes alone, words in a
    batch; rows of more than 4 tokens in two passes): the integer sums are exact, so the bits must be the same."""
    part = random_blocks(kind, 12, 512, seed=31)
    x = torch.randn(8, 512, generator=torch.Generator().manual_seed(32))
    alone = [qdot(lib, [part], x[t : t + 1], 12, width=width)[1][0] for t in range(8)]
    for n in (2, 3, 4, 5, 8):
        status, y = qdot(lib, [part], x[:n], 12, width=width)
        assert status == 0
        for t in range(n):
            assert torch.equal(y[t], alone[t]), (n, t)


@pytest.mark.parametrize("width", list(WIDTHS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_non_finite_activation_makes_its_tokens_products_non_finite(lib: ctypes.CDLL, kind: str, width: str) -> None:
    """NaN or inf has no integer: its block's scale is NaN, so the token's outputs are NaN as a float product's would
    be non-finite (the engine then fails that request alone), never a finite number made of garbage integers; the
    other tokens' rows are untouched."""
    part = random_blocks(kind, 6, 512, seed=41)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(42))
    clean = qdot(lib, [part], x, 6, width=width)[1]
    x[0, 37], x[1, 300] = float("nan"), float("inf")
    status, y = qdot(lib, [part], x, 6, width=width)
    assert status == 0
    assert not y[0].isfinite().any() and not y[1].isfinite().any()
    assert torch.equal(y[2], clean[2])


def _extreme_blocks(kind: str, rows: int, cols: int) -> BlockWeight:
    """Every weight integer at its largest magnitude: even rows all bits set, odd rows none (Q4_0 / Q5_0 / Q6_K's
    most negative value; Q8_0: 127 and -127), d and min 1, Q6_K's int8 scales -128, Q4_K / Q5_K's 6-bit scales
    and mins 63."""
    raw = np.full((rows, cols // BLOCK_ELEMS[kind], BLOCK_BYTES[kind]), 0xFF, dtype=np.uint8)
    raw[1::2] = 0x81 if kind == "Q8_0" else 0x00
    if kind == "Q8_0":
        raw[0::2] = 0x7F
    if kind == "Q6_K":
        raw[:, :, 192:208] = 0x80
    if kind in ("Q4_K", "Q5_K"):
        raw[:, :, 4:16] = 0xFF
    for offset in HALF_FIELDS[kind]:
        raw[:, :, offset : offset + 2] = np.array([1.0], dtype="<f2").view(np.uint8)
    return BlockWeight(kind, torch.from_numpy(raw.reshape(rows, -1)), cols)


@pytest.mark.parametrize("width", list(WIDTHS))
@pytest.mark.parametrize("kind", KINDS)
def test_integer_extremes_neither_saturate_nor_overflow(lib: ctypes.CDLL, kind: str, width: str) -> None:
    cols, ntok = 512, 8
    part = _extreme_blocks(kind, 4, cols)
    w = part.dequantize().numpy().astype(np.float64)
    signs = np.where(np.random.default_rng(1).random((ntok, cols)) < 0.5, -1.0, 1.0)
    signs[0], signs[1] = np.sign(w[0]) + (w[0] == 0), -np.sign(w[0]) - (w[0] == 0)  # every product one sign
    x = (3.0 * signs).astype(np.float32)  # each activation at its block's largest magnitude: q = +-top exactly
    status, y = qdot(lib, [part], torch.from_numpy(x), 4, width=width)
    assert status == 0
    exact = x.astype(np.float64) @ w.T
    assert np.abs(y.numpy() - exact).max() <= SLACK * (np.abs(x) @ np.abs(w).T).max()


@pytest.mark.parametrize(
    ("case", "ntok", "cols", "kind", "ldy"),
    [
        ("no token rows", 0, 256, None, 8),
        ("more token rows than the kernel takes", 9, 256, None, 8),
        ("columns not whole super-blocks", 2, 288, "Q4_K", 8),
        ("columns not whole blocks", 2, 48, None, 8),
        ("an unknown block kind", 2, 256, 10, 8),
        ("rows past the output's row stride", 2, 256, None, 3),
    ],
)
def test_arguments_out_of_range_are_refused_and_nothing_is_written(
    lib: ctypes.CDLL, case: str, ntok: int, cols: int, kind: str | int | None, ldy: int
) -> None:
    part = random_blocks("Q4_K" if kind == "Q4_K" else "Q8_0", 4, 512, seed=1)
    if isinstance(kind, int):
        part = BlockWeight.__new__(BlockWeight)  # a kind BlockWeight itself refuses: straight to C
        object.__setattr__(part, "kind", "Q2_K")
        object.__setattr__(part, "data", torch.zeros(4, 84 * 2, dtype=torch.uint8))
        object.__setattr__(part, "cols", 512)
    x = torch.randn(max(ntok, 1), 512)[:ntok] if ntok else torch.randn(0, 512)
    n_kind = {"Q2_K": 10}.get(part.kind, GGML_TYPE_IDS[part.kind])
    data = (ctypes.c_void_p * 1)(part.data.data_ptr())
    y = torch.full((max(ntok, 1), max(ldy, 4)), 7.0)
    status = lib.qdot_matmul(
        1, data, (ctypes.c_int * 1)(n_kind), (ctypes.c_int * 1)(4), cols, x.data_ptr(), ntok, y.data_ptr(), ldy
    )
    assert status == -1, case
    assert (y == 7.0).all(), case


# ---------------------------------------------------------------------- BlockLinear's choice of kernel


def _layer(activations: str | None) -> tuple[BlockLinear, torch.Tensor]:
    part = random_blocks("Q4_K", 24, 512, seed=5)
    w = part.dequantize()
    return BlockLinear(w, None, [part], activations=activations), w


def test_each_activation_mode_runs_its_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(3))
    float_layer, w = _layer("float")
    int8_layer, _ = _layer("int8")
    int16_layer, _ = _layer("int16")
    exact = x.double() @ w.double().T
    scale = (x.double().abs() @ w.double().abs().T).max().item()  # float32 slack is relative to sum |x w|
    float_err = (float_layer(x).double() - exact).abs().max().item()
    assert float_err < 2e-6 * scale
    for layer, top in ((int8_layer, 127), (int16_layer, INT16_TOP)):
        seen, _ = quantised_activations(x.numpy(), top)
        vs_seen = (layer(x).double() - torch.from_numpy(seen @ w.double().numpy().T)).abs().max().item()
        assert vs_seen < SLACK * scale
        assert (layer(x).double() - exact).abs().max().item() > 10 * vs_seen  # not the float product
        assert torch.equal(layer(x, prefill=True), layer(x))  # "int8" / "int16": every pass
    monkeypatch.delenv("RADIXCACHE_GGUF_ACTIVATIONS", raising=False)
    default, _ = _layer(None)  # "int16-decode": int16 in decode passes, float in a pure prefill pass
    assert default.activations == "int16-decode"
    assert torch.equal(default(x), int16_layer(x)) and torch.equal(default(x, prefill=True), float_layer(x))
    decode_mode, _ = _layer("int8-decode")  # the same with int8
    assert torch.equal(decode_mode(x), int8_layer(x)) and torch.equal(decode_mode(x, prefill=True), float_layer(x))
    monkeypatch.setenv("RADIXCACHE_GGUF_ACTIVATIONS", "int8")
    assert _layer(None)[0].kernel_for(3) == "int8"
    monkeypatch.setenv("RADIXCACHE_GGUF_ACTIVATIONS", "fp8")
    listed = "int16-decode, float, int16, int8, int8-decode, auto"
    with pytest.raises(
        ValueError, match=rf"\$RADIXCACHE_GGUF_ACTIVATIONS='fp8' is not a GGUF activations mode: use one of {listed}"
    ):
        _layer(None)


@pytest.mark.parametrize(
    ("kinds", "kernel"),
    [
        (["Q4_K"], "int16"),
        (["Q6_K"], "int16"),
        (["Q5_K"], "int16"),
        (["Q4_1"], "float"),
        (["Q8_0"], "float"),
        (["Q4_K", "Q4_K", "Q8_0"], "int16"),  # K-quant parts hold most of the bytes
        (["Q8_0", "Q8_0", "Q4_K"], "float"),
    ],
)
def test_int16_decode_gives_k_quant_matrices_16_bit_decode_rows_and_the_others_float(
    kinds: list[str], kernel: str
) -> None:
    parts = [random_blocks(k, 8, 512, seed=i) for i, k in enumerate(kinds)]
    w = torch.cat([p.dequantize() for p in parts])
    layer = BlockLinear(w, None, parts, activations="int16-decode")
    assert layer.decode_kernel == kernel
    assert {layer.kernel_for(n) for n in range(1, 9)} == {kernel} and layer.kernel_for(3, prefill=True) == "float"
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(8))
    alone = BlockLinear(w, None, parts, activations=kernel)
    assert torch.equal(layer(x, decode_rows=3), alone(x))  # decode rows: that kernel's bits
    assert BlockLinear(w, None, parts, activations="int8-decode").decode_kernel == "int8"
    assert BlockLinear(w, None, parts, activations="float").decode_kernel is None


def test_auto_measures_once_per_signature_and_keeps_one_kernel_for_every_row_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer, w = _layer("auto")
    x = torch.randn(8, 512, generator=torch.Generator().manual_seed(4))
    y = layer(x[:2])
    chosen = activation_choices()[((("Q4_K", 24),), 512)]
    assert chosen in ("float", "int16", "int8") and {layer.kernel_for(n) for n in range(1, 9)} == {chosen}
    assert torch.equal(y, BlockLinear(w, None, layer.parts, activations=chosen)(x[:2]))
    together = layer(x)
    for t in range(8):  # a row's result does not depend on its batch
        torch.testing.assert_close(layer(x[t : t + 1])[0], together[t], rtol=1e-5, atol=1e-5)
    measured = []
    monkeypatch.setattr(BlockLinear, "_measure", lambda self: measured.append(self.out_features) or "float")
    again, _ = _layer("auto")  # same signature: the earlier choice, nothing measured
    assert again.kernel_for(2) == chosen and measured == []
    other = BlockLinear(w[:8], None, [random_blocks("Q4_K", 8, 512, seed=6)], activations="auto")
    assert other.kernel_for(3) == "float" and measured == [8]
