"""RMSNorm and decode attention through the native library, for the small batches of `quant="gguf"` decode.

At batch 1 a decode step of the eager model is about 45 ATen calls per layer, and their per-call overhead, not
their arithmetic, is what is left once the products read GGUF blocks: an RMSNorm of one 576-wide row takes
about 40 us as six calls, and PyTorch's flash kernel about 70 us for one query over 513 positions. The two
native functions do the same work in one call each (blockdot.c: `native_rms_norm`, `native_decode_attention`),
in float32 with the sum of squares in double and a max-subtracted softmax: the same function, other rounding.

`NativeDecodeOps` is what the model (its norms, for up to `max_rows` rows) and the decode mirror (its attention)
call in that mode; anything else (more rows, another dtype or device) goes back to the PyTorch versions.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

import torch

from radixcache.runtime.native import blockdot


class NativeDecodeOps:
    """The native norm and attention with their fallbacks (see the module docstring)."""

    def __init__(self, max_rows: int = 4) -> None:
        self._lib = blockdot()
        self.max_rows = max_rows

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        fallback: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor],
    ) -> torch.Tensor:
        """RMSNorm of x `[T, C]` (float32, CPU, T <= max_rows) natively, else `fallback(x, weight, eps)`."""
        if x.dim() != 2 or not 0 < x.shape[0] <= self.max_rows or not _cpu_f32(x, weight):
            return fallback(x, weight, eps)
        x = x.contiguous()
        out = torch.empty_like(x)
        status = self._lib.native_rms_norm(x.data_ptr(), weight.data_ptr(), x.shape[0], x.shape[1], eps, out.data_ptr())
        if status != 0:
            raise RuntimeError(f"native_rms_norm refused a {tuple(x.shape)} input")
        return out

    def supports(self, q: torch.Tensor, keys: torch.Tensor) -> bool:
        """Whether `attend` runs natively for these tensors (float32 on the CPU, rows dense per head)."""
        return _cpu_f32(q, keys) and keys.stride(-1) == 1 and keys.stride(-2) == keys.shape[-1]

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        """One query per sequence: q `[B, H, D]` over rows `[>= B, KV, capacity, D]` (keys and values with the same
        strides), sequence b attending to its first `lengths[b]` positions. Returns `[B, H, D]`."""
        b, h, d = q.shape
        if keys.stride() != values.stride() or keys.shape != values.shape or keys.shape[0] < b:
            raise ValueError(f"key and value rows must match and hold {b} sequences: {tuple(keys.shape)}")
        q = q.contiguous()
        out = torch.empty_like(q)
        lens = (ctypes.c_int * b)(*lengths)
        status = self._lib.native_decode_attention(
            q.data_ptr(), b, h, keys.shape[1], d, keys.data_ptr(), values.data_ptr(), keys.stride(0), keys.stride(1),
            lens, keys.shape[2], out.data_ptr(),
        )  # fmt: skip
        if status != 0:
            raise ValueError(f"native_decode_attention refused lengths {list(lengths)} for rows {tuple(keys.shape)}")
        return out


def _cpu_f32(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
