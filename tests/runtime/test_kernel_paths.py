"""runtime.model.linear's named paths (what the kernel measurement chooses between): each computes x @ W.T + b within
float32 summation error of a float64 reference at every row count and at the model's real shapes, and a layer
given measured paths runs exactly the path named for its row count, holding the reordered copy only when a path
needs it."""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime.model.linear import PATHS, DenseLinear, _has_onednn_linear

ROWS = [1, 2, 3, 5, 8, 9, 16, 17, 64, 300]
SHAPES = [(80, 96), (960, 576), (576, 1536)]  # a small one; SmolLM2's fused qkv and down
# float32 products of n terms: each rounding ~6e-8 relative; a sum of n terms drifts ~sqrt(n) of that against the
# float64 result. 1e-5 relative (Frobenius) is ~10x what 1536 terms give and ~1000x below a wrong product.
REL = 1e-5


def _data(rows: int, out_f: int, in_f: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) / in_f**0.5
    b = torch.randn(out_f, generator=g)
    x = torch.randn(rows, in_f, generator=g)
    return w, b, x


def _runnable() -> list[str]:
    return [p for p in PATHS if p != "onednn" or _has_onednn_linear()]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{o}x{i}" for o, i in SHAPES])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("path", _runnable())
def test_each_path_matches_a_float64_reference(path: str, bias: bool, shape: tuple[int, int]) -> None:
    out_f, in_f = shape
    for rows in ROWS:
        w, b, x = _data(rows, out_f, in_f, seed=rows)
        bb = b if bias else None
        layer = DenseLinear(w, bb)
        got = layer.run(path, x)
        want = x.double() @ w.double().T + (0 if bb is None else bb.double())
        assert got.shape == (rows, out_f) and got.dtype == torch.float32
        err = ((got.double() - want).norm() / want.norm()).item()
        assert err < REL, f"{path} at {rows} rows: relative error {err:.3g}"


def test_measured_paths_run_the_path_named_for_each_row_count() -> None:
    """Each row count runs its own entry (bit for bit the same as calling that path), counts past the table the
    last entry; prefill=True changes nothing once paths are measured."""
    paths = _runnable()
    table = tuple(paths[(i * 7) % len(paths)] for i in range(12))
    w, b, _ = _data(1, 80, 96)
    layer = DenseLinear(w, b)
    layer.use_paths(table)
    reference = DenseLinear(w, b)
    for rows in [1, 2, 3, 7, 11, 12, 40]:
        x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
        want_path = table[rows] if rows < len(table) else table[-1]
        for prefill in (False, True):
            assert torch.equal(layer(x, prefill), reference.run(want_path, x)), (rows, want_path, prefill)
    x3 = torch.randn(2, 3, 96, generator=torch.Generator().manual_seed(5))  # 6 rows once flattened
    assert torch.equal(layer(x3), reference.run(table[6], x3.reshape(6, 96)).reshape(2, 3, 80))


@pytest.mark.skipif(not _has_onednn_linear(), reason="this torch has no oneDNN linear ops")
def test_the_reordered_copy_lives_only_while_a_path_reads_it() -> None:
    w, _, x = _data(4, 80, 96)
    layer = DenseLinear(w)
    assert layer._packed is not None  # the fixed rules use it
    layer.use_paths(("mm_t", "mm_t", "linear"))
    assert layer._packed is None and layer.paths == ("mm_t", "mm_t", "linear")
    with pytest.raises(ValueError, match="reordered"):
        layer.run("onednn", x)
    layer.use_paths(("linear", "linear", "onednn"))
    assert layer._packed is not None
    torch.testing.assert_close(layer(x), x @ w.T, rtol=1e-5, atol=1e-5)
    layer.use_paths(("linear", "linear"))
    layer.use_paths(None)  # back to the fixed rules, which read the copy again
    assert layer._packed is not None and layer.paths is None
    unpacked = DenseLinear(w, prepack=False)  # opted out of the copy: the fixed rules never make it
    unpacked.use_paths(("linear", "onednn"))
    assert unpacked._packed is not None
    unpacked.use_paths(None)
    assert unpacked._packed is None and unpacked.paths is None


def test_paths_a_weight_cannot_run_are_refused() -> None:
    w, _, _ = _data(1, 80, 96)
    with pytest.raises(ValueError, match="do not all run"):
        DenseLinear(w.double()).use_paths(("linear", "mm_t"))  # the MKL and oneDNN paths are float32 only
    with pytest.raises(ValueError, match="do not all run"):
        DenseLinear(w).use_paths(("linear", "gemm"))
    with pytest.raises(ValueError, match="do not all run"):
        DenseLinear(w).use_paths(("linear",))  # no entry for one row
    with pytest.raises(ValueError, match="path must be one of"):
        DenseLinear(w).run("gemm", torch.zeros(1, 96))
    layer = DenseLinear(w.double())
    layer.use_paths(("linear", "linear"))
    assert layer.can_run("linear") and not layer.can_run("mm_t") and not layer.can_run("onednn")


def test_the_transposed_product_does_not_depend_on_the_input_layout() -> None:
    """mm_t's own output is a transposed (column-major) view, and the next layer takes it (or silu(gate) * up of
    it) as input: a column-major input gives exactly the row-major input's result, through `run` and `__call__`
    (the fixed rules take mm_t for 2 rows), and matches the float64 reference."""
    w, b, x = _data(2, 576, 1536, seed=3)
    column_major = x.t().contiguous().t()
    assert not column_major.is_contiguous() and torch.equal(column_major, x)
    layer = DenseLinear(w, b)
    want = x.double() @ w.double().T + b.double()
    for run in (lambda t: layer.run("mm_t", t), layer):
        got = run(column_major)
        assert torch.equal(got, run(x))
        assert ((got.double() - want).norm() / want.norm()).item() < REL
