"""A linear layer that keeps a GGUF file's own blocks for small batches (`quant="gguf"`).

The float32 weights the loader builds from a GGUF file are its blocks dequantised (runtime.model.dequant). The
blocks take 0.56 to 1.06 bytes per weight (Q4_0 .. Q8_0; Q4_K 0.56, Q6_K 0.82) against 4 for float32, and batch-1
decode streams every weight once per token, so small batches multiply by the blocks themselves.

`BlockLinear` runs a native kernel (runtime.native) for up to `max_tokens` rows (decode batches of 1 to 8) and the
float32 `DenseLinear` above that (prefill chunks, larger batches), where the products are compute-bound and oneDNN
is faster. Three kernels take the same blocks:
- "float" (`blockdot.c`): float32 activations; the same product as the dense weight's, in another summation order.
- "int16" (`qdot.c`, `qdot16_matmul`): each token's activations rounded to 16 bits per 32 values (one scale per
  block, |v| <= 32639, held as two int8 planes) and integer dot products; the error this adds is at most 1/65278
  of each block's largest magnitude per activation, 257 times finer than int8 (about 3e-6 of sum |x w| against
  float's 3e-8 and int8's 1e-3).
- "int8" (`qdot.c`, `qdot_matmul`): activations quantised to int8 per 32 values (as llama.cpp's Q8_0 activations);
  at most 1/254 of each block's largest magnitude.
At one token the integer kernels do less work per weight than the float one, whose products are bound by
arithmetic (one conversion and one multiply per weight) where a K-quant unpacks its super-blocks: on a 4096 x 4096
product, 2 threads, Zen 4 (2026-12-05) Q4_K float 0.49 ms, int16 0.30, int8 0.25; Q6_K 0.69, 0.36, 0.31. The
32-value kinds gain less, and in a decode's order (SmolLM2's 120 Q4_1 products, weights streaming from memory)
16 bits take 4.08 ms against float's 4.02 (int8 3.51).
Modes (`activations=`, else `$RADIXCACHE_GGUF_ACTIVATIONS`, else DEFAULT_ACTIVATIONS):
- "int16-decode" (the default) and "int8-decode": an integer kernel for decode rows, in groups of up to
  `max_tokens`, and float for prefill-chunk rows whatever else shares their pass, so a row's result depends on its
  kind, never on its batch, and a prompt's tail after a cached prefix gets the float products an uncached prompt's
  chunk gets. "int8-decode" runs int8 for every matrix; "int16-decode" runs 16 bits where K-quants (Q4_K, Q5_K,
  Q6_K) hold most of a matrix's bytes and float elsewhere (`decode_kernel`, fixed per matrix). The model says which
  rows decode with `decode_rows`; a caller that does not gets the decode kernel unless `prefill`.
- "float", "int16", "int8": that kernel in every pass of up to `max_tokens` rows.
- "auto": times the three kernels once per process for each weight signature (block kinds, rows, columns), at 1 and
  8 token rows, at its first call, and keeps the fastest for every token count.
model.llama builds the output head with `head_activations`: "int16-decode" beside the 16-bit modes, "float" beside
the others (int8 rounding of the final hidden state changed a greedy answer: docs/runtime.md).
Why the int8 modes stay opt-in: rounding is a step function, so it turns the float32 noise of everything before it
(a prefill's products differ by ~1e-5 between 1 and 2 threads and between batches: MKL's split) into jumps of one
step. With int8 steps a greedy decode's logits then differ by 0.3 to 0.8 between 1 and 2 threads, and 13 of 16
greedy answers of 96 tokens changed between a batch and one request at a time; the engine's promise that the
cache, the batch and the thread count change no output would hold only up to near-ties of that size. 16-bit steps
are 257 times smaller (measured with every SmolLM2 matrix on them): logits differ by at most 3e-3 (float: 6e-5),
and 1 of 16 answers of 256 tokens changed (at its 153rd token; float: none, int8-decode: 13 of 16 within 96).
Perplexity is float's to 3 decimals (SmolLM2 Q4_1 20.685, its Q4_K_M-like file 21.973); int8 moved it +0.35%.
(Scripts and figures: docs/benchmarks.md, run AH.)
A fused matrix (q/k/v, gate/up) keeps one block part per source tensor, each writing its own columns of the output.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radixcache.runtime.model.block_names import ACTIVATIONS, KINDS
from radixcache.runtime.model.dequant import GGML_TYPE_IDS, GGML_TYPES
from radixcache.runtime.model.linear import DenseLinear

BLOCK = 32  # weights per block (a K-quant super-block holds 8 of them)
BLOCK_ELEMS = {k: GGML_TYPES[GGML_TYPE_IDS[k]][1] for k in KINDS}
BLOCK_BYTES = {k: GGML_TYPES[GGML_TYPE_IDS[k]][2] for k in KINDS}
DEFAULT_ACTIVATIONS = "int16-decode"  # the module docstring says why; the output head's: head_activations
ACTIVATIONS_ENV = "RADIXCACHE_GGUF_ACTIVATIONS"  # the mode where none is given
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")  # the kinds whose decode rows "int16-decode" gives 16-bit activations
TIMING_ROUNDS = 5  # per kernel, alternating; the fastest round of each is compared


def resolve_activations(activations: str | None) -> str:
    """The mode a BlockLinear given `activations` runs: it, else `$RADIXCACHE_GGUF_ACTIVATIONS`, else the default.
    ValueError, naming the variable, when the variable holds no mode (the caller checks `activations`)."""
    if activations:
        return activations
    from_env = os.environ.get(ACTIVATIONS_ENV)
    if from_env and from_env not in ACTIVATIONS:
        raise ValueError(
            f"${ACTIVATIONS_ENV}={from_env!r} is not a GGUF activations mode: use one of {', '.join(ACTIVATIONS)}"
        )
    return from_env or DEFAULT_ACTIVATIONS


def head_activations(activations: str | None) -> str:
    """The output head's mode beside layers in `activations`: "int16-decode" with the 16-bit modes (rounding 257 times
    finer than int8 moves no greedy answer there), "float" with every other (int8 rounding of the final hidden state
    moved one: docs/runtime.md)."""
    return "int16-decode" if resolve_activations(activations) in ("int16", "int16-decode") else "float"


@dataclass(frozen=True)
class BlockWeight:
    """A `[rows, cols]` weight as GGUF blocks: `data` is uint8 `[rows, cols / block elements * block bytes]`."""

    kind: str
    data: torch.Tensor
    cols: int

    def __post_init__(self) -> None:
        if self.kind not in BLOCK_BYTES:
            raise ValueError(f"block kind must be one of {', '.join(BLOCK_BYTES)}, got {self.kind!r}")
        n = BLOCK_ELEMS[self.kind]
        if self.cols % n:
            raise ValueError(f"{self.kind} rows hold whole blocks of {n}; {self.cols} columns is not a multiple")
        want = self.cols // n * BLOCK_BYTES[self.kind]
        if self.data.dtype != torch.uint8 or self.data.dim() != 2 or self.data.shape[1] != want:
            got = f"{self.data.dtype} {tuple(self.data.shape)}"
            raise ValueError(f"{self.kind} data must be uint8 [rows, {want}], got {got}")
        if self.data.device.type != "cpu":  # the kernels read its data pointer as host memory
            raise ValueError(f"{self.kind} blocks must be on the CPU, got {self.data.device}")

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dequantize(self) -> torch.Tensor:
        """The float32 weight `[rows, cols]` (for tests and for the dense path)."""
        from radixcache.runtime.model.dequant import dequantize

        raw = self.data.contiguous().numpy()
        values = dequantize(raw, GGML_TYPE_IDS[self.kind], (self.rows, self.cols))
        return torch.from_numpy(np.ascontiguousarray(values))


# (block kinds and rows of the parts, columns) -> "float" or "int8": what "auto" measured, per process.
_CHOICES: dict[tuple[tuple[tuple[str, int], ...], int], str] = {}


def activation_choices() -> dict[tuple[tuple[tuple[str, int], ...], int], str]:
    """A copy of the kernels "auto" chose so far in this process (for reports and tests)."""
    return dict(_CHOICES)


class BlockLinear:
    """Block kernel for up to `max_tokens` rows, the float32 dense layer above (see the module docstring)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        parts: Sequence[BlockWeight],
        activations: str | None = None,
    ) -> None:
        from radixcache.runtime.native import blockdot

        activations = resolve_activations(activations)
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")
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
        self.activations = activations
        self._kernels = {"float": lib.blockdot_matmul, "int16": lib.qdot16_matmul, "int8": lib.qdot_matmul}
        self.decode_kernel = self._decode_kernel()
        self._signature = tuple((p.kind, p.rows) for p in self.parts)
        # The call's fixed arguments, built once: the part arrays live as long as the layer (so do the blocks).
        n = len(self.parts)
        self._n = n
        self._data = (ctypes.c_void_p * n)(*(p.data.data_ptr() for p in self.parts))
        self._kinds = (ctypes.c_int * n)(*(GGML_TYPE_IDS[p.kind] for p in self.parts))
        self._rows = (ctypes.c_int * n)(*(p.rows for p in self.parts))

    @property
    def nbytes(self) -> int:
        """Bytes a small-batch product streams: the blocks."""
        return sum(p.nbytes for p in self.parts)

    def _decode_kernel(self) -> str | None:
        """The kernel of a "-decode" mode's decode rows (None in the other modes): "int8" for "int8-decode";
        for "int16-decode", "int16" where K-quant parts hold most of the blocks' bytes, else "float"."""
        if self.activations == "int8-decode":
            return "int8"
        if self.activations != "int16-decode":
            return None
        k_bytes = sum(p.nbytes for p in self.parts if p.kind in K_QUANTS)
        return "int16" if 2 * k_bytes > self.nbytes else "float"

    def kernel_for(self, rows: int, prefill: bool = False) -> str:
        """The kernel ("float", "int16" or "int8") a call with `rows` token rows (1..max_tokens) runs: one for every
        count, so that a row's result does not depend on the batch it is in. A "-decode" mode runs "float" for a
        pure prefill pass (`prefill`) and its decode kernel otherwise."""
        if self.decode_kernel is not None:
            return "float" if prefill else self.decode_kernel
        if self.activations != "auto":
            return self.activations
        key = (self._signature, self.in_features)
        if key not in _CHOICES:
            _CHOICES[key] = self._measure()
        return _CHOICES[key]

    def _measure(self) -> str:
        """The kernels at 1 and at max_tokens rows, alternating, TIMING_ROUNDS each; the kernel whose best times
        sum to the smallest share (time / all kernels' times, added over both row counts) wins."""
        share = {name: 0.0 for name in self._kernels}
        for rows in (1, self.max_tokens):
            x = torch.randn(rows, self.in_features, generator=torch.Generator().manual_seed(rows))
            y = torch.empty(rows, self.out_features)
            best = {name: float("inf") for name in self._kernels}
            for _ in range(TIMING_ROUNDS):  # a cold first round only loses to the later ones
                for name in best:
                    start = time.perf_counter()
                    self._run(name, x, y)
                    best[name] = min(best[name], time.perf_counter() - start)
            for name in best:
                share[name] += best[name] / sum(best.values())
        return min(share, key=lambda name: share[name])

    def _by_row_kind(self, x: torch.Tensor, decodes: int, prefill: bool) -> torch.Tensor:
        """A "-decode" mode with the rows' kinds known: the first `decodes` rows on its decode kernel, `max_tokens`
        at a time, the prefill-chunk rows after them on the float kernel (or the dense layer past `max_tokens`). So a
        decode row gets the same result alone, in a batch of 16 or beside a 500-token chunk, and a chunk's last row
        the same as in a pure prefill pass (float: the block and dense products differ only in summation order)."""
        if x.shape[1] != self.in_features:
            raise ValueError(f"input has {x.shape[1]} features, the layer takes {self.in_features}")
        x = x.contiguous()
        rows = x.shape[0]
        chunk_rows = rows - decodes
        if chunk_rows > self.max_tokens:
            dense = self.dense(x[decodes:], prefill)  # carries the bias
            if not decodes:
                return dense
            y = torch.empty(rows, self.out_features, dtype=torch.float32)
            y[decodes:] = dense
        else:
            y = torch.empty(rows, self.out_features, dtype=torch.float32)
            if chunk_rows:
                self._run("float", x[decodes:], y[decodes:])
        for lo in range(0, decodes, self.max_tokens):
            hi = min(decodes, lo + self.max_tokens)
            self._run(self.decode_kernel, x[lo:hi], y[lo:hi])
        if self.bias is None:
            return y
        kernel_rows = decodes if chunk_rows > self.max_tokens else rows
        y[:kernel_rows] += self.bias
        return y

    def _run(self, kernel: str, x: torch.Tensor, y: torch.Tensor) -> None:
        rows = x.shape[0]
        status = self._kernels[kernel](
            self._n, self._data, self._kinds, self._rows, self.in_features, x.data_ptr(), rows, y.data_ptr(), y.shape[1]
        )
        if status != 0:  # the arguments are checked by the caller; -2 is a failed allocation in the kernel
            raise RuntimeError(f"the {kernel} block kernel refused its arguments (status {status})")

    def __call__(self, x: torch.Tensor, prefill: bool = False, *, decode_rows: int | None = None) -> torch.Tensor:
        if x.dim() != 2:
            y = self(x.reshape(-1, x.shape[-1]), prefill, decode_rows=decode_rows)
            return y.reshape(*x.shape[:-1], y.shape[-1])
        if x.device.type != "cpu":  # the kernels would read its data pointer as host memory
            raise ValueError(f"quant='gguf' runs on the CPU; the input is on {x.device}")
        rows = x.shape[0]
        if self.decode_kernel is not None and decode_rows is not None and rows and x.dtype == torch.float32:
            return self._by_row_kind(x, min(max(decode_rows, 0), rows), prefill)
        if rows == 0 or rows > self.max_tokens or x.dtype != torch.float32:
            return self.dense(x, prefill)
        if x.shape[1] != self.in_features:
            raise ValueError(f"input has {x.shape[1]} features, the layer takes {self.in_features}")
        x = x.contiguous()
        y = torch.empty(rows, self.out_features, dtype=torch.float32)
        self._run(self.kernel_for(rows, prefill), x, y)
        return y if self.bias is None else y + self.bias
