"""Linear layers for the forward pass: `y = x @ W.T + b` with W in `[out, in]` layout, in one of two forms.

- `DenseLinear`: weights in the model's dtype. On the CPU in float32 the kernel is picked by the number of rows,
  from measurements on this project's 2-core machine (docs/benchmarks.md). From 3 rows up (decode batches and
  prefill chunks) it runs oneDNN's linear (`torch.ops.mkldnn._linear_pointwise`) on a copy of the weight that
  oneDNN reordered once, at load, into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, the
  internal ops inductor uses): 1.05 to 2.3 times F.linear, most at 8 to 32 rows. For 1 or 2 rows (batch-1
  decode) it computes `(W @ x.T).T` on the plain weight instead: the same product, but MKL then runs a GEMM
  whose narrow side is the batch, which streams W faster than both F.linear and the reordered oneDNN kernel; one
  row is padded to two, because MKL's one-column path (GEMV) is the slow one. Prefill chunks of 17 to 63 rows
  (`prefill=True`) keep F.linear: its float32 summation order is the one the float64-reference tests (prompts of
  ~20 tokens, bound 1e-4) were tuned on, and the reordered kernel moved that test from 6.5e-5 to 9.9e-5. Cost:
  the weights are held twice (plain and reordered). `prepack=False` keeps one copy and uses F.linear from 3 rows.
  Those are the fixed rules (`kernels="fixed"`). The engine's default measures the four paths (`PATHS`:
  "linear", "mm_t", "onednn", "native") on this machine instead and gives each layer its fastest per row count
  (`use_paths`, runtime.model.kernel_tune): the same product, in another summation order. A layer whose paths
  never name "onednn" drops the reordered copy. "native" is runtime/native/densedot.c, a float32 product for 1 to
  8 rows that streams W once for all of them on one sequential stream per thread (larger inputs run in chunks of 8
  rows); where its paths name it, the native decode layers (model.native_layers) run the float32 model's decode
  passes too.
- `Float16Linear` (`quant="fp16"`): weights stored in float16 and packed for fbgemm; activations stay float32.
  Half the bytes to read per token, results within float16 rounding of the weights.

- `BlockLinear` (`quant="gguf"`, runtime.model.block_linear): the GGUF file's own Q4_1 / Q8_0 blocks through a native
  kernel for decode batches of up to 4 rows, the dense layer above.

The fp16 form runs on the CPU only and uses PyTorch's fbgemm operators (`torch.ops.quantized`). An int8 form was
built and measured, and dropped: fbgemm quantises a whole input batch with one scale, which raised perplexity by
two thirds and changed greedy answers (docs/benchmarks.md, "Weight formats").
"""

from __future__ import annotations

import ctypes
from typing import Protocol

import torch
import torch.nn.functional as F

_TRANSPOSED_MAX_ROWS = 2  # up to this many rows: the transposed MKL product; above: the reordered oneDNN weight
_PREFILL_PLAIN_ROWS = range(17, 64)  # prefill chunks of these sizes keep F.linear (see the module docstring)
# F.linear; (W @ x.T).T, one row padded to two; oneDNN on the reordered copy; densedot.c (runtime.native)
PATHS = ("linear", "mm_t", "onednn", "native")
NATIVE_ROWS = 8  # rows per densedot call (its BLOCKDOT_MAX_TOKENS); more run in chunks of this many


class Linear(Protocol):
    """What the model calls: `[T, in]` -> `[T, out]` in the model's dtype (any leading shape works).
    `prefill` says the rows are a prefill chunk (a kernel may pick its summation order by it); `decode_rows`, when
    the caller knows it, says the first that many rows are decode rows and the rest prefill-chunk rows (a kernel
    whose arithmetic differs by the kind of row uses it: model.block_linear's "int8-decode")."""

    out_features: int

    def __call__(self, x: torch.Tensor, prefill: bool = False, *, decode_rows: int | None = None) -> torch.Tensor: ...

    @property
    def nbytes(self) -> int: ...


class DenseLinear:
    """Weights in the model's dtype; see the module docstring for the CPU kernels."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, prepack: bool = True) -> None:
        self.weight = weight.contiguous()
        self.bias = bias
        self.out_features, self.in_features = weight.shape  # as BlockLinear names them
        self._cpu = weight.device.type == "cpu"
        self._packed: torch.Tensor | None = None
        self._by_rows: tuple[str, ...] | None = None  # measured paths: [rows] for rows < len, the last one above
        self._prepack = prepack
        self._native: _NativeWeight | bool | None = False  # False: not looked up yet; None: the path cannot run
        if prepack and self.can_run("onednn"):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight)

    @property
    def nbytes(self) -> int:
        """Bytes of one copy of the weight (what a product streams), not counting the reordered copy."""
        return self.weight.numel() * self.weight.element_size()

    @property
    def paths(self) -> tuple[str, ...] | None:
        """The measured path per row count (index: rows; the last entry serves every larger count), or None for
        the fixed rules."""
        return self._by_rows

    def can_run(self, path: str) -> bool:
        """Whether `path` (one of PATHS) runs for this weight: "mm_t", "onednn" and "native" on float32 CPU weights
        only, "onednn" where this torch has the ops, "native" where the native library builds."""
        if path == "linear":
            return True
        if path not in PATHS or not self._cpu or self.weight.dtype != torch.float32:
            return False
        if path == "native":
            return self.native_weight() is not None
        return path == "mm_t" or _has_onednn_linear()

    def native_weight(self) -> _NativeWeight | None:
        """The weight as densedot.c takes it (pointer tables over this layer's own storage, no copy), or None where
        the path cannot run (not float32 on the CPU, or no native library on this machine)."""
        if self._native is False:
            self._native = None
            if self._cpu and self.weight.dtype == torch.float32:
                self._native = _NativeWeight.of(self.weight)
        return self._native  # type: ignore[return-value]

    def path_for(self, rows: int) -> str | None:
        """The measured path that `rows` rows run, or None under the fixed rules."""
        measured = self._by_rows
        if measured is None:
            return None
        return measured[rows] if rows < len(measured) else measured[-1]

    def use_paths(self, by_rows: tuple[str, ...] | None) -> None:
        """Run `by_rows[rows]` for `rows` (the last entry for every larger count; index 0 serves an empty input),
        or the fixed rules with None. The reordered copy is made if a path needs it and dropped if none does; the
        fixed rules get it back unless the layer was built with prepack=False."""
        if by_rows is not None:
            if len(by_rows) < 2 or any(not self.can_run(p) for p in by_rows):
                raise ValueError(f"paths {by_rows!r} do not all run for this {self.weight.dtype} weight")
            if "onednn" in by_rows and self._packed is None:
                self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight)
            elif "onednn" not in by_rows:
                self._packed = None
        elif not (self._prepack and self.can_run("onednn")):
            self._packed = None  # the fixed rules as built: F.linear from 3 rows
        elif self._packed is None:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight)
        self._by_rows = by_rows

    def run(self, path: str, x: torch.Tensor) -> torch.Tensor:
        """One named path (PATHS) on a 2-D input; the tuner times each, the tests check each."""
        if path == "linear":
            return F.linear(x, self.weight, self.bias)
        if path == "onednn":
            if self._packed is None:
                raise ValueError("the onednn path needs the reordered weight (prepack, or use_paths naming it)")
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        if path == "native":
            native = self.native_weight()
            if native is None:
                raise ValueError("the native path needs a float32 CPU weight and the native library (a C compiler)")
            y = native.matmul(x)
            return y if self.bias is None else y + self.bias
        if path != "mm_t":
            raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
        rows = x.shape[0]
        padded = torch.cat((x, x)) if rows == 1 else x.contiguous()  # see __call__
        y = torch.mm(self.weight, padded.t())[:, :rows].t()
        return y if self.bias is None else y + self.bias

    def __call__(self, x: torch.Tensor, prefill: bool = False, *, decode_rows: int | None = None) -> torch.Tensor:
        if x.dim() != 2:
            return _rows(self, x, prefill)
        rows = x.shape[0]
        measured = self._by_rows
        if measured is not None:
            return self.run(measured[rows] if rows < len(measured) else measured[-1], x)
        plain = self._packed is None or (prefill and rows in _PREFILL_PLAIN_ROWS)
        if not self._cpu or (plain and rows > _TRANSPOSED_MAX_ROWS):
            return F.linear(x, self.weight, self.bias)
        if rows > _TRANSPOSED_MAX_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        # Row-major x: this path's own output is a transposed view (so is what silu(gate) * up makes of it), and MKL
        # multiplies W by that column-major operand 4.5x slower (down_proj at 2 rows: 584 against 130 us a call).
        padded = torch.cat((x, x)) if rows == 1 else x.contiguous()
        y = torch.mm(self.weight, padded.t())[:, :rows].t()
        return y if self.bias is None else y + self.bias


class _NativeWeight:
    """A float32 weight's pointer tables for densedot_matmul (one part, kind F32), kept with the library."""

    def __init__(self, weight: torch.Tensor, lib: ctypes.CDLL) -> None:
        self.weight = weight  # held: the tables point into its storage
        self.lib = lib
        self.data = (ctypes.c_void_p * 1)(weight.data_ptr())
        self.kinds = (ctypes.c_int * 1)(0)  # KIND_F32 (runtime/native/ggml_blocks.h)
        self.rows = (ctypes.c_int * 1)(weight.shape[0])

    @classmethod
    def of(cls, weight: torch.Tensor) -> _NativeWeight | None:
        from radixcache.runtime.native import NativeBuildError, blockdot

        if weight.dim() != 2 or not weight.is_contiguous() or weight.shape[0] < 1:
            return None
        try:
            return cls(weight, blockdot())
        except NativeBuildError:
            return None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T for x `[T, in]` float32, in chunks of NATIVE_ROWS rows."""
        out_f, in_f = self.weight.shape
        if x.dim() != 2 or x.shape[1] != in_f or x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"the native path takes float32 CPU rows [T, {in_f}], got {x.dtype} {tuple(x.shape)}")
        x = x.contiguous()
        y = torch.empty(x.shape[0], out_f)
        for lo in range(0, x.shape[0], NATIVE_ROWS):
            rows = min(NATIVE_ROWS, x.shape[0] - lo)
            status = self.lib.densedot_matmul(
                1, self.data, self.kinds, self.rows, in_f, x[lo].data_ptr(), rows, y[lo].data_ptr(), out_f
            )
            if status != 0:
                raise RuntimeError(f"densedot_matmul refused a [{rows}, {in_f}] input for a {out_f}x{in_f} weight")
        return y


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

    def __call__(self, x: torch.Tensor, prefill: bool = False, *, decode_rows: int | None = None) -> torch.Tensor:
        if x.dim() != 2:
            return _rows(self, x, prefill)
        return torch.ops.quantized.linear_dynamic_fp16(x, self._packed)


def _has_onednn_linear() -> bool:
    """Whether this torch build has oneDNN, its fused linear op and its weight reorder (internal ops that inductor
    uses)."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("_linear_pointwise", "_reorder_linear_weight")
    )


def _rows(layer: Linear, x: torch.Tensor, prefill: bool) -> torch.Tensor:
    """Apply `layer` to an input of any leading shape by flattening it to rows."""
    y = layer(x.reshape(-1, x.shape[-1]), prefill)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def _require_quantized_cpu(weight: torch.Tensor, quant: str) -> None:
    if weight.device.type != "cpu":
        raise ValueError(f"quant={quant!r} runs on the CPU only; the weight is on {weight.device}")


def _f32(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.float().contiguous()
