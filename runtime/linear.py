"""Linear layers for the forward pass: `y = x @ W.T + b` with W in `[out, in]` layout, in one of two forms.

- `DenseLinear`: weights in the model's dtype. On the CPU the kernel is picked by the number of rows, from
  measurements on this project's 2-core machine (docs/benchmarks.md). Up to 4 rows (a small decode batch) it
  computes `(W @ x.T).T` instead of `F.linear(x, W)`: the same product, but MKL then runs a GEMM whose narrow side
  is the batch, which streams W 1.5 to 2.5 times faster; one row is padded to two, because MKL's one-column path
  (GEMV) is the slow one. From 5 to 16 rows, and from 64 rows up (prefill chunks), oneDNN's linear
  (`torch.ops.mkldnn._linear_pointwise`, where this torch has it) is the fastest: 1.1 to 1.3 times `F.linear`.
  Between 17 and 63 rows `F.linear` stays: there the kernels are close, and F.linear's fp32 summation order is
  the one the float64-reference tests (prompts of ~20 tokens, bound 1e-4) were tuned on.
- `Float16Linear` (`quant="fp16"`): weights stored in float16 and packed for fbgemm; activations stay float32.
  Half the bytes to read per token, results within float16 rounding of the weights.

The fp16 form runs on the CPU only and uses PyTorch's fbgemm operators (`torch.ops.quantized`). An int8 form was
built and measured, and dropped: fbgemm quantises a whole input batch with one scale, which raised perplexity by
two thirds and changed greedy answers (docs/benchmarks.md, "Weight formats").
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

QUANT_MODES = ("none", "fp16")

# CPU kernel choice by rows (see the module docstring): transposed MKL product, oneDNN, F.linear, oneDNN again.
_TRANSPOSED_MAX_ROWS = 4
_ONEDNN_MAX_ROWS = 16
_ONEDNN_MIN_PREFILL_ROWS = 64


class Linear(Protocol):
    """What the model calls: `[T, in]` -> `[T, out]` in the model's dtype (any leading shape works)."""

    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...

    @property
    def nbytes(self) -> int: ...


class DenseLinear:
    """Weights in the model's dtype; see the module docstring for the CPU layout trick."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight = weight.contiguous()
        self.bias = bias
        self.out_features = weight.shape[0]
        self._cpu = weight.device.type == "cpu"
        self._onednn = self._cpu and weight.dtype == torch.float32 and _has_onednn_linear()

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return _rows(self, x)
        rows = x.shape[0]
        onednn = self._onednn and (_TRANSPOSED_MAX_ROWS < rows <= _ONEDNN_MAX_ROWS or rows >= _ONEDNN_MIN_PREFILL_ROWS)
        if onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if not self._cpu or rows > _TRANSPOSED_MAX_ROWS:
            return F.linear(x, self.weight, self.bias)
        padded = torch.cat((x, x)) if rows == 1 else x
        y = torch.mm(self.weight, padded.t())[:, :rows].t()
        return y if self.bias is None else y + self.bias


class Float16Linear:
    """float16 weights packed for fbgemm, float32 activations and accumulation."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        _require_quantized_cpu(weight, "fp16")
        self.out_features = weight.shape[0]
        self._nbytes = weight.numel() * 2
        self._packed = torch.ops.quantized.linear_prepack_fp16(weight.float().contiguous(), _f32(bias))

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return _rows(self, x)
        return torch.ops.quantized.linear_dynamic_fp16(x, self._packed)


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None = None, quant: str = "none") -> Linear:
    """The linear layer for `quant` ("none" or "fp16"); weight `[out, in]`."""
    if quant == "none":
        return DenseLinear(weight, bias)
    if quant == "fp16":
        return Float16Linear(weight, bias)
    raise ValueError(f"quant must be one of {', '.join(QUANT_MODES)}, got {quant!r}")


def check_quant(quant: str, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse a quantised mode where its kernels cannot run (raises ValueError that says why)."""
    if quant not in QUANT_MODES:
        raise ValueError(f"quant must be one of {', '.join(QUANT_MODES)}, got {quant!r}")
    if quant == "none":
        return
    if device.type != "cpu":
        raise ValueError(f"quant={quant!r} runs on the CPU only (fbgemm kernels); got device {device}")
    if dtype != torch.float32:
        raise ValueError(f"quant={quant!r} needs float32 activations; got dtype {dtype}")
    if not {"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines):
        raise ValueError(f"quant={quant!r} needs PyTorch's fbgemm kernels, which this torch build lacks")


def _has_onednn_linear() -> bool:
    """Whether this torch build has oneDNN and its fused linear op (an internal op that inductor uses)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _rows(layer: Linear, x: torch.Tensor) -> torch.Tensor:
    """Apply `layer` to an input of any leading shape by flattening it to rows."""
    y = layer(x.reshape(-1, x.shape[-1]))
    return y.reshape(*x.shape[:-1], y.shape[-1])


def _require_quantized_cpu(weight: torch.Tensor, quant: str) -> None:
    if weight.device.type != "cpu":
        raise ValueError(f"quant={quant!r} runs on the CPU only; the weight is on {weight.device}")


def _f32(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.float().contiguous()
