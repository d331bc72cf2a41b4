"""A linear layer that keeps a GGUF file's own Q4_1 / Q8_0 blocks for small batches (`quant="gguf"`).

The float32 weights the loader builds from a GGUF file are its blocks dequantised: `d * q + m` (Q4_1) or `d * q`
(Q8_0). Multiplying by the blocks themselves is therefore the same product, float32 throughout, in another
summation order; what changes is the bytes read per token: SmolLM2's Q4_1 and Q8_0 blocks are 0.625 and 1.06
bytes per weight against 4 for float32, and batch-1 decode streams every weight once per token.

`BlockLinear` runs the native kernel (runtime.native, `blockdot.c`) for up to `max_tokens` rows (decode batches
of 1 to 4) and the float32 `DenseLinear` above that (prefill chunks, larger batches), where the products are
compute-bound and oneDNN is faster. A fused matrix (q/k/v, gate/up) keeps one block part per source tensor, each
writing its own columns of the output.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radixcache.runtime.model.linear import DenseLinear

BLOCK = 32  # weights per block in both formats
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}


@dataclass(frozen=True)
class BlockWeight:
    """A `[rows, cols]` weight as GGUF blocks: `data` is uint8 `[rows, cols / 32 * block bytes]`, row-major."""

    kind: str
    data: torch.Tensor
    cols: int

    def __post_init__(self) -> None:
        if self.kind not in BLOCK_BYTES:
            raise ValueError(f"block kind must be one of {', '.join(BLOCK_BYTES)}, got {self.kind!r}")
        if self.cols % BLOCK:
            raise ValueError(f"{self.kind} rows hold whole blocks of {BLOCK}; {self.cols} columns is not a multiple")
        want = self.cols // BLOCK * BLOCK_BYTES[self.kind]
        if self.data.dtype != torch.uint8 or self.data.dim() != 2 or self.data.shape[1] != want:
            got = f"{self.data.dtype} {tuple(self.data.shape)}"
            raise ValueError(f"{self.kind} data must be uint8 [rows, {want}], got {got}")

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dequantize(self) -> torch.Tensor:
        """The float32 weight `[rows, cols]` (for tests and for the dense path)."""
        from radixcache.runtime.model.dequant import GGML_TYPE_IDS, dequantize

        raw = self.data.contiguous().numpy()
        values = dequantize(raw, GGML_TYPE_IDS[self.kind], (self.rows, self.cols))
        return torch.from_numpy(np.ascontiguousarray(values))


class BlockLinear:
    """Block kernel for up to `max_tokens` rows, the float32 dense layer above (see the module docstring)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, parts: Sequence[BlockWeight]) -> None:
        from radixcache.runtime.native import blockdot

        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            raise ValueError(f"quant='gguf' runs on the CPU in float32; got {weight.dtype} on {weight.device}")
        if not parts or sum(p.rows for p in parts) != weight.shape[0] or any(p.cols != weight.shape[1] for p in parts):
            shapes = [(p.rows, p.cols) for p in parts]
            raise ValueError(f"block parts {shapes} do not stack to the weight's shape {tuple(weight.shape)}")
        lib = blockdot()
        if len(parts) > lib.blockdot_max_parts():
            raise ValueError(f"at most {lib.blockdot_max_parts()} block parts per matrix, got {len(parts)}")
        self.out_features = weight.shape[0]
        self.in_features = weight.shape[1]
        self.parts = tuple(BlockWeight(p.kind, p.data.contiguous(), p.cols) for p in parts)
        self.bias = bias
        self.dense = DenseLinear(weight, bias)
        self.max_tokens = lib.blockdot_max_tokens()
        self._matmul = lib.blockdot_matmul
        # The call's fixed arguments, built once: the part arrays live as long as the layer (so do the blocks).
        n = len(self.parts)
        self._n = n
        self._data = (ctypes.c_void_p * n)(*(p.data.data_ptr() for p in self.parts))
        self._kinds = (ctypes.c_int * n)(*(_KIND_IDS[p.kind] for p in self.parts))
        self._rows = (ctypes.c_int * n)(*(p.rows for p in self.parts))

    @property
    def nbytes(self) -> int:
        """Bytes a small-batch product streams: the blocks."""
        return sum(p.nbytes for p in self.parts)

    def __call__(self, x: torch.Tensor, prefill: bool = False) -> torch.Tensor:
        if x.dim() != 2:
            y = self(x.reshape(-1, x.shape[-1]), prefill)
            return y.reshape(*x.shape[:-1], y.shape[-1])
        rows = x.shape[0]
        if rows == 0 or rows > self.max_tokens or x.dtype != torch.float32:
            return self.dense(x, prefill)
        if x.shape[1] != self.in_features:
            raise ValueError(f"input has {x.shape[1]} features, the layer takes {self.in_features}")
        x = x.contiguous()
        y = torch.empty(rows, self.out_features, dtype=torch.float32)
        status = self._matmul(
            self._n,
            self._data,
            self._kinds,
            self._rows,
            self.in_features,
            x.data_ptr(),
            rows,
            y.data_ptr(),
            self.out_features,
        )
        if status != 0:  # the arguments are checked above; this would be a bug in this class
            raise RuntimeError(f"blockdot_matmul refused its arguments (status {status})")
        return y if self.bias is None else y + self.bias


_KIND_IDS = {"Q4_1": 0, "Q8_0": 1}  # blockdot.c's KIND_* values
