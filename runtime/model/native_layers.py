"""A decode pass's decoder layers in one native call (runtime/native/decode_layers.c), for quant="gguf" and for
float32 models whose measured kernels (model.kernel_tune) run every product natively.

At batch 1 the eager layer is about a dozen Python-level calls into native kernels and ATen, a few microseconds
of interpreter and dispatch each: about 1.5 ms of a 10 ms SmolLM2 step on this project's 2-core machine, where
llama.cpp runs its whole graph in C. `NativeLayers.run` hands the layers to C, which calls the same native
functions in the same order on the same buffers: the same bits as the eager pass
(tests/runtime/engine/test_native_layers.py), minus the interpreter.

It serves what FusedDecode serves (decodes only, attention over the decode mirror) when, in addition, every
product of every layer takes the pass's rows natively and the rows fit the native norm: with quant="gguf" every
product is a block kernel (runtime/model/block_linear.py); in a float32 model every product is a DenseLinear and
the measured plan puts at least 3/4 of each layer's weights on "native" for that many rows
(runtime/native/densedot.c, which then runs all of them; under the fixed rules none is).
`run` returns None for anything else: the eager layers run.
`head` then ends a decode-only pass in one more native call (`native_decode_head`): the final norm, the output head's
product as the eager head runs it (a block product, or a float32 head whose measured path for the rows is "native")
and each row's greedy token (runtime/native/row_argmax.c, read by the threads that wrote the logits): where the eager
head took a norm call, the head's checks and product and a numpy argmax over a row half written by the other core,
each with the caches cold after the weights streamed past, this saves 0.08-0.17 ms of a 6.6-6.9 ms SmolLM2 gguf step
and 0.18-0.23 ms of an 11-12.8 ms float32 one (steps alternating in one process, head on and off: adjacent steps'
ratio 0.983-0.986). The same bits; the scheduler takes the token for plain-greedy rows that no grammar masks
(runtime.engine.scheduler). Where the model asks (`FusedDecode.head_request`) and the head takes the rows natively,
`run` computes the same in the layers' own call instead (`native_decode_step`, result in `FusedDecode.head_result`):
on two threads or more the layers run without barriers (runtime/native/decode_team.c) on the calling thread and
helper threads of the library's own (runtime/native/team_pool.c), the head's rows one more shared phase, and the
call returns once the step's work is done, whoever did it: it never waits for a helper the machine descheduled. A
helper still inside a finished step may read the weights and the mirror, so the plan waits for none to be
(`native_team_quiesce`) before a cached mirror or the plan itself (which holds the layers) is dropped.
The plan (pointer tables of the weights) is built once per model; the kernel of each product is looked up once
per row count, as BlockLinear's own `kernel_for` decides it. A float32 pass has the bits of an eager pass whose
products all run "native": the eager layers take the native SiLU for any row count this plan `takes`
(model.llama).
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from radixcache.runtime.model.block_linear import BlockLinear
from radixcache.runtime.model.linear import NATIVE_ROWS, DenseLinear

if TYPE_CHECKING:
    from radixcache.runtime.model.fused_decode import FusedDecode
    from radixcache.runtime.native.ops import NativeDecodeOps

_PRODUCTS = ("qkv", "o", "gate_up", "down")


def silu_mul(gated: torch.Tensor, native: NativeDecodeOps | None) -> torch.Tensor:
    """SiLU(gate) * up of the gate_up rows `[T, 2 I]`: with `native` (quant="gguf") the native layers' own function,
    so that a decode row gets the same bits in a mixed pass as in a native one; else ATen's."""
    if native is not None and (out := native.silu_mul(gated)) is not None:
        return out
    gate, up = gated.chunk(2, dim=-1)
    return F.silu(gate) * up


class NativeLinear(ctypes.Structure):
    """One block product (decode_layers.c `native_linear`)."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("kinds", ctypes.c_void_p),
        ("rows", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("nparts", ctypes.c_int),
        ("cols", ctypes.c_int),
        ("out", ctypes.c_int),
        ("kernel", ctypes.c_int),
    ]


class NativeLayer(ctypes.Structure):
    """One decoder layer (decode_layers.c `native_layer`)."""

    _fields_ = [("ln_in", ctypes.c_void_p), ("ln_post", ctypes.c_void_p)] + [(n, NativeLinear) for n in _PRODUCTS]


_DENSE_KERNEL = 2  # decode_layers.c's kernel id of densedot_matmul
NATIVE_SHARE = 0.75  # a float32 layer runs natively where its plan puts this much of its weights on "native"


def _kernel_id(linear: BlockLinear, rows: int) -> int:
    """The kernel BlockLinear runs for `rows` decode rows (its `__call__` with decode_rows=rows, no prefill)."""
    name = linear.decode_kernel or linear.kernel_for(rows, False)
    return {"float": 0, "int8": 1, "int16": 3}[name]


def _native_dense(linear: object) -> bool:
    return isinstance(linear, DenseLinear) and linear.can_run("native")


TEAM_MAX_ROWS = 8  # runtime/native/decode_team.c's TEAM_MAX_ROWS


class NativeLayers:
    """The model's layers as one native call per decode pass (see the module docstring)."""

    def __init__(self, model: Any, lib: ctypes.CDLL, dense: bool = False) -> None:
        cfg = model.config
        self.dense = dense  # float32 DenseLinear products (densedot.c) rather than GGUF blocks
        self._dense_takes: dict[int, tuple[Any, Any, bool]] = {}  # rows -> (paths seen, ..., all native); _takes
        self._lib = lib
        self._config = cfg  # not the model, which holds this plan: a cycle keeps weights until a full collection
        self._layers = model.layers
        self._inter = model.layers[0].gate_up.out_features // 2  # gate_up's rows: gate, then up
        self._hidden = cfg.hidden_size
        self._eps = cfg.rms_norm_eps
        self._by_rows: dict[int, ctypes.Array[NativeLayer]] = {}
        self._mirror: tuple[Any, ctypes.Array[ctypes.c_void_p], ctypes.Array[ctypes.c_void_p]] | None = None
        self._step_lock = threading.Lock()  # run's: engines on other threads may share this plan (_mirror_tables)
        self._heads: dict[int, tuple[object, NativeLinear]] = {}  # rows -> (head, its product); _head_entry
        self._max_norm_rows = model.native.max_rows  # the eager norm is native up to this many rows (native.ops)
        # a decode-only pass's head runs in the layers' call (`run`, native_decode_step); off: `head` runs it after
        # (scripts/bench_native_ab.py, which swaps the layers' call alone)
        self.fuse_head = True

    def __del__(self) -> None:
        self._quiesce()  # the weights this plan holds may be freed next

    def _quiesce(self) -> None:
        """Wait until no helper of decode_team.c's steps is inside one (they may read the weights and the mirror
        after the call that ran the step returned: runtime/native/team_pool.h)."""
        quiesce = getattr(getattr(self, "_lib", None), "native_team_quiesce", None)
        if quiesce is not None:
            quiesce()

    @classmethod
    def build(cls, model: Any) -> NativeLayers | None:
        """The plan for `model`, or None where its layers cannot all run natively (another kind of product, a norm
        weight that is not float32 on the CPU, no native library)."""
        native = getattr(model, "native", None)
        if native is None or not model.layers:
            return None
        dense = _native_dense(model.layers[0].qkv)
        for layer in model.layers:
            if dense and not all(_native_dense(getattr(layer, n)) for n in _PRODUCTS):
                return None
            if not dense and not all(isinstance(getattr(layer, n), BlockLinear) for n in _PRODUCTS):
                return None
            for w in (layer.ln_in, layer.ln_post):
                if w.device.type != "cpu" or w.dtype != torch.float32 or not w.is_contiguous():
                    return None
            if any(b is not None and not b.is_contiguous() for b in (getattr(layer, n).bias for n in _PRODUCTS)):
                return None
        inter = model.layers[0].gate_up.out_features
        if inter % 2 or any(layer.gate_up.out_features != inter for layer in model.layers):
            return None
        return cls(model, native._lib, dense)

    def _table(self, rows: int) -> ctypes.Array[NativeLayer]:
        """The layer table for `rows` decode rows (each product's kernel chosen as BlockLinear chooses it)."""
        table = self._by_rows.get(rows)
        if table is None:
            table = (NativeLayer * len(self._layers))()
            for entry, layer in zip(table, self._layers, strict=True):
                entry.ln_in, entry.ln_post = layer.ln_in.data_ptr(), layer.ln_post.data_ptr()
                for name in _PRODUCTS:
                    linear = getattr(layer, name)
                    native = self._dense_entry(linear) if self.dense else self._block_entry(linear, rows)
                    setattr(entry, name, native)
            self._by_rows[rows] = table
        return table

    @staticmethod
    def _block_entry(linear: BlockLinear, rows: int) -> NativeLinear:
        """A block product for `rows` decode rows, its kernel chosen as BlockLinear chooses it."""
        bias = linear.bias.data_ptr() if linear.bias is not None else None
        data, kinds, parts = (ctypes.cast(a, ctypes.c_void_p) for a in (linear._data, linear._kinds, linear._rows))
        cols, out = linear.in_features, linear.out_features
        return NativeLinear(data, kinds, parts, bias, linear._n, cols, out, _kernel_id(linear, rows))

    @staticmethod
    def _dense_entry(linear: DenseLinear) -> NativeLinear:
        weight = linear.native_weight()
        assert weight is not None  # build() checked every product
        bias = linear.bias.data_ptr() if linear.bias is not None else None
        data, kinds, parts = (ctypes.cast(a, ctypes.c_void_p) for a in (weight.data, weight.kinds, weight.rows))
        cols, out = linear.in_features, linear.out_features
        return NativeLinear(data, kinds, parts, bias, 1, cols, out, _DENSE_KERNEL)

    def _head_entry(self, head: object, rows: int) -> NativeLinear | None:
        """The output head's product for `rows` decode rows as the eager head runs it, or None where it would not
        run natively: a BlockLinear up to its max_tokens (its kernel chosen as `_table` chooses the layers'), a
        DenseLinear whose measured path for `rows` is "native" (looked up each call: a retuned plan may move it)."""
        if isinstance(head, DenseLinear):
            if rows > NATIVE_ROWS or head.path_for(rows) != "native" or head.native_weight() is None:
                return None
        elif not isinstance(head, BlockLinear) or rows > head.max_tokens:
            return None
        if head.in_features != self._hidden:
            return None
        entry = self._heads.get(rows)
        if entry is None or entry[0] is not head:
            native = self._dense_entry(head) if isinstance(head, DenseLinear) else self._block_entry(head, rows)
            entry = self._heads[rows] = (head, native)  # holds the head: its tables stay alive while cached
        return entry[1]

    def head(
        self, x: torch.Tensor, norm: torch.Tensor, eps: float, head: object
    ) -> tuple[torch.Tensor, tuple[int | None, ...]] | None:
        """The logits `[rows, vocab]` of the decode rows x `[rows, hidden]` after the last layer (RMSNorm by `norm`,
        then `head`) and each row's greedy token (the first index of its maximum; None where that is not finite),
        in one native call (decode_layers.c `native_decode_head`): the bits of LlamaModel.logits over the same rows
        as a decode pass runs it, and the token runtime.engine.output.greedy_tokens would pick. Where the eager
        path runs more than one call with the caches cold after the weights streamed past (the norm, the head's
        checks and product, a numpy argmax over a row half written by the other core), this is 0.08-0.17 ms of a
        6.6-6.9 ms SmolLM2 gguf step (the module docstring). None (nothing computed) where the head's product does
        not run natively for these rows or the norm would not (more rows than the native norm takes): the eager
        head runs."""
        rows = x.shape[0]
        if not 0 < rows <= self._max_norm_rows or x.dim() != 2 or x.dtype != torch.float32 or not x.is_cpu:
            return None
        if norm.dtype != torch.float32 or not norm.is_cpu or not norm.is_contiguous():
            return None
        entry = self._head_entry(head, rows)
        if entry is None:
            return None
        x = x.contiguous()
        logits = torch.empty(rows, entry.out)
        best = (ctypes.c_long * rows)()
        status = self._lib.native_decode_head(
            x.data_ptr(), rows, self._hidden, eps, norm.data_ptr(), ctypes.byref(entry), logits.data_ptr(), best
        )
        if status != 0:
            raise RuntimeError(f"native_decode_head failed with status {status} for {rows} rows")
        return logits, tuple(b if b >= 0 else None for b in best)

    def team_takes(self, rows: int) -> bool:
        """Whether a pass of `rows` rows goes to these layers, and there to the team without barriers
        (decode_team.c: up to 8 rows, on two threads or more; its byte cap is past any pass of 4 rows at 4,000
        positions of a SmolLM2-sized model, and a pass over it runs the barriers' way, the same bits)."""
        return 0 < rows <= min(self._max_norm_rows, TEAM_MAX_ROWS) and self.takes(rows)

    def takes(self, rows: int) -> bool:
        """Whether the native layers take `rows` rows: always for blocks (up to their max_tokens); for float32
        products, where the plan puts most of every layer on "native" (`_mostly_native`)."""
        if not self.dense:
            return rows <= self._layers[0].qkv.max_tokens
        # a plan is applied to every layer at once (kernel_tune.apply_plan): the first and last products' path
        # tables (held here, so their identities cannot be reused) say whether the answer below still stands
        first, last = self._layers[0].qkv.paths, self._layers[-1].down.paths
        cached = self._dense_takes.get(rows)
        if cached is None or cached[0] is not first or cached[1] is not last:
            ok = rows <= NATIVE_ROWS and all(self._mostly_native(layer, rows) for layer in self._layers)
            cached = self._dense_takes[rows] = (first, last, ok)
        return cached[2]

    @staticmethod
    def _mostly_native(layer: Any, rows: int) -> bool:
        """Whether the plan puts at least NATIVE_SHARE of the layer's weights on "native" for `rows` rows. The
        native layers then run every product natively: the plan's timings include a Python call per product,
        which the native layers do not make, and that is what a small product loses by (SmolLM2's o_proj at 1 row,
        2 threads: 82 us a call on MKL against 101 natively, where its 1.3 MB take about 45 us to read)."""
        linears = [getattr(layer, n) for n in _PRODUCTS]
        if not all(isinstance(x, DenseLinear) for x in linears):
            return False  # a product replaced since build() (a wrapper, a test's injected failure): eager layers
        native = sum(x.weight.numel() for x in linears if x.path_for(rows) == "native")
        return native >= NATIVE_SHARE * sum(x.weight.numel() for x in linears)

    def _mirror_tables(self, k: tuple[torch.Tensor, ...], v: tuple[torch.Tensor, ...]) -> tuple[Any, Any] | None:
        """Per-layer pointers of the mirror's K and V rows, rebuilt only when the mirror reallocates them; None
        where the rows are not all float32 on the CPU, dense per head, with one shape and one set of strides."""
        cached = self._mirror  # read once: engines on other threads may share this model (and so this plan)
        if cached is None or cached[0] is not k:
            k0 = k[0]
            same = all(t.shape == k0.shape and t.stride() == k0.stride() for t in (*k, *v))
            dense = k0.stride(-1) == 1 and k0.stride(-2) == k0.shape[-1]
            if len(k) != len(self._layers) or not same or not dense:
                return None
            if not all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (*k, *v)):
                return None
            if cached is not None:
                self._quiesce()  # the cached mirror may be freed once this plan lets it go
            n = len(self._layers)
            ks = (ctypes.c_void_p * n)(*(t.data_ptr() for t in k))
            vs = (ctypes.c_void_p * n)(*(t.data_ptr() for t in v))
            cached = self._mirror = (k, ks, vs)  # holds the tuple, so its identity cannot be reused while cached
        return cached[1], cached[2]

    def run(self, x: torch.Tensor, fused: FusedDecode) -> torch.Tensor | None:
        """The hidden states after every layer for the decode rows x `[B, hidden]`, or None (nothing computed,
        nothing written) where this pass must take the eager layers; with the head too where `_step_head` says so
        (its logits and greedy tokens in `fused.head_result`). One thread at a time from the mirror's tables to the
        call's return: the cached mirror is then the one the last step read, held until a quiesce lets it go (a
        helper late for that step may still read it: runtime/native/team_pool.h)."""
        with self._step_lock:
            return self._run(x, fused)

    def _run(self, x: torch.Tensor, fused: FusedDecode) -> torch.Tensor | None:
        mirror, native = fused.mirror, fused.native
        rows = x.shape[0]
        if (mirror.order is None) != (mirror.inverse is None) or mirror.native is None:
            return None
        if not 0 < rows <= native.max_rows or x.dtype != torch.float32 or not self.takes(rows):
            return None
        tables = self._mirror_tables(mirror.k, mirror.v)
        if tables is None:
            return None
        ks, vs = tables
        k0, kv, cfg = mirror.k[0], fused.pool.kv, self._config
        out = x.contiguous()  # a fresh tensor (the embedding's rows): updated in place
        lengths = (ctypes.c_int * rows)(*mirror.row_lengths)
        cos, ssin = fused.tables
        rows_t, pos_t = fused.mirror_at
        order = inverse = None
        if mirror.order is not None and mirror.inverse is not None:  # rows out of batch order (a request left)
            order, inverse = mirror.order.to(torch.int64).contiguous(), mirror.inverse.to(torch.int64).contiguous()
        head = self._step_head(fused, rows)
        call, extra = self._lib.native_decode_layers, ()
        if head is not None:  # the head in the same call (native_decode_step): one parallel region a step
            logits, best = torch.empty(rows, head[1].out), (ctypes.c_long * rows)()
            call = self._lib.native_decode_step
            extra = (head[0].data_ptr(), ctypes.byref(head[1]), logits.data_ptr(), best)
        status = call(
            self._table(rows), len(self._layers), out.data_ptr(), rows, self._hidden, cfg.num_heads,
            cfg.num_kv_heads, cfg.head_dim, self._inter, self._eps, fused.positions.data_ptr(), cos.data_ptr(),
            ssin.data_ptr(), cos.shape[0], kv.data_ptr(), kv.stride(0), kv.stride(1), fused.slots.data_ptr(),
            kv.shape[2] * kv.shape[3], ks, vs, k0.stride(0), k0.stride(1), rows_t.data_ptr(), pos_t.data_ptr(),
            k0.shape[0], k0.shape[2], lengths, None if order is None else order.data_ptr(),
            None if inverse is None else inverse.data_ptr(), *extra, fused.team,
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"native_decode_layers failed with status {status} for {rows} rows")
        if head is not None:
            fused.head_result = (logits, tuple(b if b >= 0 else None for b in best))
        return out

    def _step_head(self, fused: FusedDecode, rows: int) -> tuple[torch.Tensor, NativeLinear] | None:
        """The final norm and the head's product for a pass whose head runs in the layers' call: where the model
        asked for it (`fused.head_request`), `head` would take these rows natively, and `fuse_head` is on."""
        request = fused.head_request
        if request is None or not self.fuse_head or not hasattr(self._lib, "native_decode_step"):
            return None
        norm, eps, head = request
        if eps != self._eps or norm.dtype != torch.float32 or not norm.is_cpu or not norm.is_contiguous():
            return None
        entry = self._head_entry(head, rows)
        return None if entry is None else (norm, entry)
