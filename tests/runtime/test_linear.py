"""runtime.model.linear: every layer form computes `F.linear(x, W, b)` (exactly up to summation order for the dense one,
within its weight rounding for fp16), leaves its input alone, and the constructors refuse what
their kernels cannot run with a message that names the problem."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixcache.runtime.model.linear import DenseLinear, Float16Linear, _has_onednn_linear
from radixcache.runtime.model.quant import QUANT_MODES, check_quant, make_linear

ROWS = [1, 2, 3, 4, 5, 8, 16, 17, 63, 64, 300]  # every CPU kernel path: <= 2 rows, 3+ (and 17..63 in prefill)
IN, OUT = 96, 80
# Summation order only: float64 rounding is ~1e-16 per operation, float32 ~6e-8, over IN=96 products.
DENSE_TOL = {torch.float64: {"rtol": 1e-12, "atol": 1e-12}, torch.float32: {"rtol": 1e-5, "atol": 1e-5}}


def _data(rows: int, dtype: torch.dtype = torch.float32, seed: int = 0, n_in: int = IN, n_out: int = OUT):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n_out, n_in, generator=g, dtype=dtype) / n_in**0.5
    b = torch.randn(n_out, generator=g, dtype=dtype)
    x = torch.randn(rows, n_in, generator=g, dtype=dtype)
    return w, b, x


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@pytest.mark.parametrize("prepack", [True, False], ids=["prepack", "plain"])
@pytest.mark.parametrize("prefill", [False, True], ids=["decode", "prefill"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("rows", ROWS)
def test_dense_equals_f_linear(rows: int, bias: bool, dtype: torch.dtype, prefill: bool, prepack: bool) -> None:
    w, b, x = _data(rows, dtype)
    bb = b if bias else None
    layer = DenseLinear(w, bb, prepack=prepack)
    got = layer(x, prefill)
    assert got.shape == (rows, OUT) and got.dtype == dtype
    torch.testing.assert_close(got, F.linear(x, w, bb), **DENSE_TOL[dtype])


def test_float32_on_the_cpu_holds_a_reordered_copy_only_when_asked() -> None:
    """The reordered oneDNN copy exists for float32 CPU weights (where this torch has the ops), never for other
    dtypes, and not with prepack=False: the memory cost is opt-out."""
    w, _, _ = _data(1)
    has_ops = _has_onednn_linear()
    assert (DenseLinear(w)._packed is not None) == has_ops
    assert DenseLinear(w, prepack=False)._packed is None
    assert DenseLinear(w.double())._packed is None


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("rows", [1, 3, 8, 17])
def test_dense_takes_1d_and_3d_inputs(rows: int, bias: bool, dtype: torch.dtype) -> None:
    w, b, _ = _data(1, dtype)
    bb = b if bias else None
    layer = DenseLinear(w, bb)
    x1 = torch.randn(IN, dtype=dtype, generator=torch.Generator().manual_seed(1))
    got1 = layer(x1)
    assert got1.shape == (OUT,)
    torch.testing.assert_close(got1, F.linear(x1, w, bb), **DENSE_TOL[dtype])
    x3 = torch.randn(2, rows, IN, dtype=dtype, generator=torch.Generator().manual_seed(2))
    got3 = layer(x3)
    assert got3.shape == (2, rows, OUT)
    torch.testing.assert_close(got3, F.linear(x3, w, bb), **DENSE_TOL[dtype])


@pytest.mark.parametrize("quant", QUANT_MODES)
@pytest.mark.parametrize("rows", [1, 2, 8, 17])
def test_layers_do_not_change_their_input_or_weights(quant: str, rows: int) -> None:
    w, b, x = _data(rows)
    w0, b0, x0 = w.clone(), b.clone(), x.clone()
    make_linear(w, b, quant)(x)
    assert torch.equal(x, x0) and torch.equal(w, w0) and torch.equal(b, b0)


# fp16 weights: each weight is rounded to 11 significant bits (relative error <= 2^-11 ~ 4.9e-4, about 2.8e-4
# rms for uniform rounding); activations and accumulation stay float32. The errors of a dot product add in
# quadrature, so the relative error of y is about 2e-4 (measured 1.8e-4 .. 2.4e-4 for these shapes): 1e-3 leaves
# 4x margin and still catches a float32 path that silently dropped to bfloat16 (8 bits: ~4e-3).
FP16_REL = 1e-3


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("rows", [1, 2, 3, 16, 17, 300])
@pytest.mark.parametrize(("cls", "bound"), [(Float16Linear, FP16_REL)], ids=["fp16"])
def test_quantised_layers_are_close_to_f_linear(cls: type, bound: float, rows: int, bias: bool) -> None:
    for n_in, n_out in [(IN, OUT), (576, 192)]:  # the second is SmolLM2's hidden size
        w, b, x = _data(rows, n_in=n_in, n_out=n_out, seed=rows)
        bb = b if bias else None
        got = cls(w, bb)(x)
        assert got.shape == (rows, n_out) and got.dtype == torch.float32
        err = _rel_err(got, F.linear(x, w, bb))
        assert err < bound, f"{cls.__name__} relative error {err:.3g} over {bound} ({n_in}->{n_out}, rows={rows})"


@pytest.mark.parametrize("quant", ["fp16"])
def test_quantised_layers_take_1d_and_3d_inputs(quant: str) -> None:
    w, b, _ = _data(1)
    layer = make_linear(w, b, quant)
    bound = FP16_REL
    x1 = torch.randn(IN, generator=torch.Generator().manual_seed(5))
    x3 = torch.randn(2, 5, IN, generator=torch.Generator().manual_seed(6))
    for x in (x1, x3):
        got = layer(x)
        assert got.shape == (*x.shape[:-1], OUT)
        assert _rel_err(got, F.linear(x, w, b)) < bound


@pytest.mark.parametrize("quant", QUANT_MODES)
def test_a_row_does_not_depend_on_the_other_rows_of_its_batch(quant: str) -> None:
    """What a decode batch or a prefill chunk holds must not change a request's own numbers: the engine's
    cache-on/cache-off and batched/alone equivalences rest on it. A loud row (an activation outlier, common in
    real models) shares the batch with a quiet one; the quiet row must come out as when computed alone."""
    w, b, x = _data(8, seed=3)
    x[2] *= 50.0
    layer = make_linear(w, b, quant)
    tol = DENSE_TOL[torch.float32]
    for rows in (4, 8):  # 4 and 8 rows take the reordered kernel; one row alone takes the transposed product
        alone, batched = layer(x[:1]), layer(x[:rows])[:1]
        torch.testing.assert_close(batched, alone, **tol, msg=lambda m, rows=rows: f"quant={quant}, {rows} rows: {m}")


def test_make_linear_builds_the_form_asked_for() -> None:
    w, b, _ = _data(1)
    assert isinstance(make_linear(w, b), DenseLinear)
    assert isinstance(make_linear(w, b, "none"), DenseLinear)
    assert isinstance(make_linear(w, b, "fp16"), Float16Linear)
    for quant in QUANT_MODES:
        assert make_linear(w, b, quant).out_features == OUT


def test_nbytes_are_four_and_two_bytes_per_weight() -> None:
    w, _, _ = _data(1, n_in=576, n_out=192)
    n = w.numel()
    assert make_linear(w, quant="none").nbytes == 4 * n
    assert make_linear(w, quant="fp16").nbytes == 2 * n
    assert DenseLinear(w.double()).nbytes == 8 * n


@pytest.mark.parametrize("bad", ["int4", "int8", "FP16", "", "float16"])
def test_an_unknown_mode_is_refused_by_name(bad: str) -> None:
    w, _, _ = _data(1)
    with pytest.raises(ValueError, match="quant must be one of none, fp16") as exc:
        make_linear(w, quant=bad)
    assert repr(bad) in str(exc.value)
    with pytest.raises(ValueError, match="quant must be one of") as exc:
        check_quant(bad, torch.device("cpu"), torch.float32)
    assert repr(bad) in str(exc.value)


@pytest.mark.parametrize("quant", ["fp16"])
@pytest.mark.parametrize("device", ["meta", "cuda", "cuda:1"])
def test_check_quant_refuses_a_device_other_than_the_cpu(quant: str, device: str) -> None:
    # check_quant only reads device.type: constructing a torch.device touches no GPU.
    with pytest.raises(ValueError, match="CPU only") as exc:
        check_quant(quant, torch.device(device), torch.float32)
    assert device in str(exc.value) and repr(quant) in str(exc.value)


@pytest.mark.parametrize("quant", ["fp16"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_check_quant_refuses_a_dtype_other_than_float32(quant: str, dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match="float32") as exc:
        check_quant(quant, torch.device("cpu"), dtype)
    assert str(dtype) in str(exc.value) and repr(quant) in str(exc.value)


def test_check_quant_accepts_what_runs() -> None:
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        check_quant("none", torch.device("meta"), dtype)  # dense runs anywhere, in any dtype
    check_quant("fp16", torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("quant", ["fp16"])
def test_a_quantised_layer_refuses_a_weight_off_the_cpu(quant: str) -> None:
    w = torch.empty(OUT, IN, device="meta")
    with pytest.raises(ValueError, match="CPU only") as exc:
        make_linear(w, quant=quant)
    assert "meta" in str(exc.value)
