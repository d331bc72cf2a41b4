"""radixcache.runtime.model.block_linear on synthetic GGUF blocks (numpy-built Q4_1 / Q8_0 bytes, no model file).

Checked against: `BlockWeight`'s refusals (kind, column count, dtype and shape, each message naming the problem);
`.dequantize()` against the `gguf` package's dequantiser on the same bytes; `BlockLinear` against a float64
`x @ W.T + b` of the dequantised weight, for the float native kernel (1 to 8 rows) and the dense path (9 and more),
single-kind and fused mixed-kind matrices, with and without bias, 1-D / 3-D / non-contiguous inputs; a row's
result against the same row inside a batch; and the refusals of a wrong feature count and of parts that do not
stack to the weight's shape. `make_linear(..., "gguf")` without blocks against DenseLinear.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from radixcache.runtime.model.block_linear import BLOCK, BLOCK_BYTES, BlockLinear, BlockWeight
from radixcache.runtime.model.dequant import GGML_TYPE_IDS
from radixcache.runtime.model.linear import DenseLinear
from radixcache.runtime.model.quant import make_linear
from radixcache.runtime.testing import random_block_weight
from tests.runtime.native.random_blocks import random_blocks as any_kind_blocks

needs_cc = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="quant='gguf' builds a C kernel: no C compiler here"
)

# float32 products summed in another order than the float64 reference: the error of a dot product of n terms is
# below n * eps32 * sum |x_k w_k| (worst case); measured up to 1.7e-7 of that sum here. Bound: 2e-6 of the sum.
REL_TO_ABS_SUM = 2e-6


def random_blocks(kind: str, rows: int, cols: int, seed: int) -> BlockWeight:
    """A `[rows, cols]` weight as random blocks (radixcache.runtime.testing.random_block_weight)."""
    return random_block_weight(kind, rows, cols, seed)


def dense_of(parts: list[BlockWeight]) -> torch.Tensor:
    return torch.cat([p.dequantize() for p in parts])


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 `x @ w.T + b` and the per-element error scale `|x| @ |w|.T` (+ |b|)."""
    want = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    if b is not None:
        want, scale = want + b.double(), scale + b.double().abs()
    return want, scale


def assert_matches(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    want, scale = reference(x, w, b)
    assert got.dtype == torch.float32 and got.shape == want.shape
    excess = ((got.double() - want).abs() - REL_TO_ABS_SUM * scale).max().item()
    assert excess <= 0, f"beyond float32 summation-order tolerance by {excess:.3g}"


# ---------------------------------------------------------------------- BlockWeight


def test_block_weight_refuses_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="Q2_K") as err:
        BlockWeight("Q2_K", torch.zeros(2, 84, dtype=torch.uint8), 256)
    assert "Q4_1" in str(err.value) and "Q6_K" in str(err.value)


def test_block_weight_refuses_blocks_off_the_cpu() -> None:
    """The kernels read the blocks' data pointer as host memory: blocks on "meta" (a null pointer; a CUDA tensor's
    is device memory) made BlockLinear's first product crash the process."""
    with pytest.raises(ValueError, match="Q8_0 blocks must be on the CPU, got meta"):
        BlockWeight("Q8_0", torch.zeros(2, 68, dtype=torch.uint8, device="meta"), 64)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_block_weight_refuses_columns_that_are_not_whole_blocks(kind: str) -> None:
    with pytest.raises(ValueError, match=r"48 columns is not a multiple"):
        BlockWeight(kind, torch.zeros(2, BLOCK_BYTES[kind], dtype=torch.uint8), 48)


@pytest.mark.parametrize(
    ("kind", "data", "needle"),
    [
        ("Q4_1", torch.zeros(2, 40, dtype=torch.int8), "torch.int8"),
        ("Q4_1", torch.zeros(2, 41, dtype=torch.uint8), r"\(2, 41\)"),
        ("Q8_0", torch.zeros(2, 40, dtype=torch.uint8), r"\(2, 40\)"),
        ("Q8_0", torch.zeros(136, dtype=torch.uint8), r"\(136,\)"),
        ("Q8_0", torch.zeros(2, 68, dtype=torch.float32), "torch.float32"),
    ],
)
def test_block_weight_refuses_wrong_dtype_or_shape(kind: str, data: torch.Tensor, needle: str) -> None:
    want = 64 // BLOCK * BLOCK_BYTES[kind]
    with pytest.raises(ValueError, match=needle) as err:
        BlockWeight(kind, data, 64)
    assert f"uint8 [rows, {want}]" in str(err.value)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize(("rows", "cols"), [(1, 32), (7, 96), (16, 256)])
def test_dequantize_equals_the_gguf_package(kind: str, rows: int, cols: int) -> None:
    # BlockWeight.dequantize calls the loader's dequantiser, so the reference is the independent one of the `gguf`
    # package (a dev dependency): ggml's own block layout, decoded by other code from the same bytes.
    bw = random_blocks(kind, rows, cols, seed=rows + cols)
    want = gguf_dequantize(bw.data.numpy(), GGMLQuantizationType[kind]).reshape(rows, cols).astype(np.float32)
    assert GGML_TYPE_IDS[kind] == int(GGMLQuantizationType[kind])
    got = bw.dequantize()
    assert got.dtype == torch.float32 and got.shape == (rows, cols)
    assert torch.equal(got, torch.from_numpy(np.ascontiguousarray(want)))
    assert bw.rows == rows and bw.nbytes == rows * cols // BLOCK * BLOCK_BYTES[kind]


# ---------------------------------------------------------------------- BlockLinear

MATRICES = {
    "q4_1": [("Q4_1", 13, 320)],
    "q8_0": [("Q8_0", 11, 320)],
    "fused": [("Q4_1", 8, 320), ("Q8_0", 17, 320), ("Q4_1", 5, 320)],
}


def build(name: str, bias: bool, seed: int = 0) -> tuple[BlockLinear, torch.Tensor, torch.Tensor | None]:
    parts = [random_blocks(k, r, c, seed=seed + i) for i, (k, r, c) in enumerate(MATRICES[name])]
    w = dense_of(parts)
    b = torch.randn(w.shape[0], generator=torch.Generator().manual_seed(seed)) if bias else None
    return BlockLinear(w, b, parts, activations="float"), w, b  # int8 / int16 activations: tests/runtime/native


def inputs(shape: tuple[int, ...], seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@needs_cc
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 17, 64])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("name", sorted(MATRICES))
def test_block_linear_equals_the_dequantised_product(name: str, bias: bool, rows: int) -> None:
    layer, w, b = build(name, bias)
    assert layer.out_features == w.shape[0] and layer.in_features == w.shape[1]
    x = inputs((rows, w.shape[1]), seed=rows)
    kept = x.clone()
    got = layer(x)
    assert torch.equal(x, kept)  # the input is left as it was
    assert_matches(got, x, w, b)
    assert_matches(layer(x, prefill=True), x, w, b)


@needs_cc
@pytest.mark.parametrize("name", sorted(MATRICES))
def test_block_linear_takes_1d_3d_and_non_contiguous_inputs(name: str) -> None:
    layer, w, b = build(name, bias=True, seed=3)
    cols = w.shape[1]
    x1 = inputs((cols,), seed=4)
    y1 = layer(x1)
    assert y1.shape == (w.shape[0],)
    assert_matches(y1[None], x1[None], w, b)
    for lead in [(1, 3), (2, 2), (3, 7)]:  # 3 and 4 rows (kernel), 21 rows (dense)
        x3 = inputs((*lead, cols), seed=5)
        y3 = layer(x3)
        assert y3.shape == (*lead, w.shape[0])
        assert_matches(y3.reshape(-1, w.shape[0]), x3.reshape(-1, cols), w, b)
    for rows in (3, 9):
        wide = inputs((rows, 2 * cols), seed=6)
        xs = wide[:, ::2]  # strided columns
        assert not xs.is_contiguous()
        kept = wide.clone()
        assert_matches(layer(xs), xs.contiguous(), w, b)
        assert torch.equal(wide, kept)
        xt = inputs((cols, rows), seed=7).t()  # transposed
        assert_matches(layer(xt), xt.contiguous(), w, b)


@needs_cc
@pytest.mark.parametrize("name", sorted(MATRICES))
def test_a_rows_result_does_not_depend_on_its_batch(name: str) -> None:
    layer, w, _ = build(name, bias=True, seed=8)
    x = inputs((4, w.shape[1]), seed=9)
    together = layer(x)
    for t in range(4):
        alone = layer(x[t : t + 1])
        torch.testing.assert_close(alone[0], together[t], rtol=1e-5, atol=1e-5)
    for n in (2, 3):
        torch.testing.assert_close(layer(x[:n]), together[:n], rtol=1e-5, atol=1e-5)


@needs_cc
@pytest.mark.parametrize("mode", ["int16-decode", "int8-decode"])
@pytest.mark.parametrize(("decodes", "chunk_rows"), [(1, 0), (0, 5), (1, 3), (3, 5), (2, 9), (9, 0), (17, 30)])
def test_a_decode_mode_gives_each_row_its_kinds_result_whatever_shares_its_pass(
    decodes: int, chunk_rows: int, mode: str
) -> None:
    """A "-decode" mode (int16-decode is the default) with the rows' kinds known (model.llama passes `decode_rows`):
    a decode row's result is the mode's integer kernel's on that row alone, a chunk row's the float product's,
    whether the pass holds 1 row or 47."""
    if mode == "int16-decode":  # its 16 bits are for K-quant matrices (the 32-value kinds' decode rows: float)
        shapes = [("Q4_K", 8, 512), ("Q6_K", 9, 512), ("Q4_K", 5, 512)]
        parts = [any_kind_blocks(k, r, c, seed=20 + i) for i, (k, r, c) in enumerate(shapes)]
    else:
        parts = [random_blocks(k, r, c, seed=20 + i) for i, (k, r, c) in enumerate(MATRICES["fused"])]
    w = dense_of(parts)
    b = torch.randn(w.shape[0], generator=torch.Generator().manual_seed(21))
    kernel = mode.removesuffix("-decode")
    layer, integer, float_ = (BlockLinear(w, b, parts, activations=a) for a in (mode, kernel, "float"))
    x = inputs((decodes + chunk_rows, w.shape[1]), seed=22)
    got = layer(x, decode_rows=decodes)
    assert got.shape == (decodes + chunk_rows, w.shape[0])
    for i in range(decodes):
        torch.testing.assert_close(got[i], integer(x[i : i + 1])[0], rtol=1e-6, atol=1e-6)
    scale = (x.abs() @ w.abs().T).max().item()  # two float32 orders differ relative to sum |x w| (see REL_TO_ABS_SUM)
    for i in range(decodes, decodes + chunk_rows):
        torch.testing.assert_close(got[i], float_(x[i : i + 1])[0], rtol=0, atol=2 * REL_TO_ABS_SUM * scale)
    if chunk_rows:
        assert_matches(got[decodes:], x[decodes:], w, b)
    if decodes:  # the integer kernel is not the float product: the two kinds really differ (else this proves nothing)
        assert (integer(x[:1]) - float_(x[:1])).abs().max() > (1e-4 if kernel == "int8" else 1e-6)


@needs_cc
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_a_wrong_feature_count_is_refused(rows: int) -> None:
    layer, w, _ = build("fused", bias=False)
    with pytest.raises(ValueError, match=rf"input has {w.shape[1] - 32} features, the layer takes {w.shape[1]}"):
        layer(inputs((rows, w.shape[1] - 32)))


@needs_cc
@pytest.mark.parametrize("activations", ["float", "int16-decode"])
@pytest.mark.parametrize(("rows", "decode_rows"), [(1, None), (2, 2), (9, None)])
def test_an_input_off_the_cpu_is_refused(activations: str, rows: int, decode_rows: int | None) -> None:
    """The kernels read the input's data pointer as host memory: a tensor elsewhere (here "meta", whose pointer is
    null; a CUDA tensor's is device memory) crashed the process, or came back as garbage from the dense path."""
    w = random_blocks("Q8_0", 16, 64, 0)
    layer = BlockLinear(w.dequantize(), None, [w], activations=activations)
    with pytest.raises(ValueError, match="runs on the CPU; the input is on meta"):
        layer(torch.zeros(rows, 64, device="meta"), decode_rows=decode_rows)


@needs_cc
def test_a_wrong_feature_count_on_the_dense_path_is_an_error() -> None:
    layer, w, _ = build("q8_0", bias=False)
    with pytest.raises((ValueError, RuntimeError)):
        layer(inputs((9, w.shape[1] + 32)))


@needs_cc
@pytest.mark.parametrize(
    "case",
    ["too_few_rows", "too_many_rows", "other_cols", "no_parts"],
)
def test_parts_that_do_not_stack_to_the_weight_are_refused(case: str) -> None:
    a, b = random_blocks("Q4_1", 8, 64, seed=1), random_blocks("Q8_0", 4, 64, seed=2)
    w = dense_of([a, b])
    parts = {
        "too_few_rows": [a],
        "too_many_rows": [a, b, b],
        "other_cols": [a, random_blocks("Q8_0", 4, 96, seed=3)],
        "no_parts": [],
    }[case]
    with pytest.raises(ValueError, match=r"do not stack to the weight's shape \(12, 64\)"):
        BlockLinear(w, None, parts)


@needs_cc
def test_block_linear_refuses_a_non_float32_weight() -> None:
    a = random_blocks("Q8_0", 4, 64, seed=1)
    with pytest.raises(ValueError, match="float32"):
        BlockLinear(a.dequantize().double(), None, [a])


@needs_cc
def test_block_linear_streams_only_its_blocks() -> None:
    layer, w, _ = build("fused", bias=False)
    assert layer.nbytes == sum(r * c // BLOCK * BLOCK_BYTES[k] for k, r, c in MATRICES["fused"])
    assert layer.nbytes < w.numel() * 4 / 2


def test_make_linear_gguf_without_blocks_is_dense() -> None:
    w, b = torch.randn(6, 64), torch.randn(6)
    for blocks in (None, []):
        layer = make_linear(w, b, "gguf", blocks)
        assert isinstance(layer, DenseLinear)
        x = torch.randn(3, 64)
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, w, b))
