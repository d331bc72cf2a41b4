"""RMSNorm and decode attention through the native library, for the small batches of `quant="gguf"` decode.

At batch 1 a decode step of the eager model is about 45 ATen calls per layer, and their per-call overhead, not
their arithmetic, is what is left once the products read GGUF blocks: an RMSNorm of one 576-wide row takes
about 40 us as six calls, and PyTorch's flash kernel about 70 us for one query over 513 positions. The two
native functions do the same work in one call each (blockdot.c: `native_rms_norm`, `native_decode_attention`),
in float32 with the sum of squares in double and a max-subtracted softmax: the same function, other rounding.

`NativeDecodeOps` is what the model (its norms, for up to `max_rows` rows; a decode pass's RoPE and K/V stores,
runtime.model.fused_decode) and the decode mirror (its attention) call in that mode; anything else (more rows,
another dtype or device) goes back to the PyTorch versions. With quant="gguf" the model also takes its
SiLU(gate) * up from here, for every row count (decode_layers.c `native_silu_mul`: the function the native decode
layers of runtime.model.native_layers use, so a decode row gets the same bits in either path).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence

import torch

from radixcache.runtime.native import blockdot

# Query rows (tokens x query heads) up to which a chunk takes `attend_pages`: each 16 of them (decode_attention.c's
# ATTN_MAX_GROUP) read the K/V once more, at about 3x the speed of PyTorch's flash kernel over the same pages.
PAGED_ROWS = 48
_INT_MAX = 2**31 - 1  # the kernels' positions and lengths are C ints
_INDEX_DTYPES = frozenset((torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64))  # a table's, as int64


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
        if weight.shape != x.shape[1:] or not weight.is_contiguous():  # the kernel reads C dense weights
            return fallback(x, weight, eps)  # which broadcasts, or names the mismatch
        x = x.contiguous()
        out = torch.empty_like(x)
        status = self._lib.native_rms_norm(x.data_ptr(), weight.data_ptr(), x.shape[0], x.shape[1], eps, out.data_ptr())
        if status != 0:
            raise RuntimeError(f"native_rms_norm refused a {tuple(x.shape)} input")
        return out

    def silu_mul(self, gated: torch.Tensor) -> torch.Tensor | None:
        """SiLU(gate) * up of rows `[T, 2 I]` (gate first) natively (decode_layers.c, the native layers' bits), or
        None for an input it does not take (not float32 on the CPU, not 2-D)."""
        if gated.dim() != 2 or gated.shape[1] % 2 or not _cpu_f32(gated):
            return None
        gated = gated.contiguous()
        out = torch.empty(gated.shape[0], gated.shape[1] // 2)
        if self._lib.native_silu_mul(gated.data_ptr(), gated.shape[0], gated.shape[1] // 2, out.data_ptr()) != 0:
            raise RuntimeError(f"native_silu_mul refused a {tuple(gated.shape)} input")
        return out

    def supports(self, q: torch.Tensor, keys: torch.Tensor) -> bool:
        """Whether `attend` runs natively for these tensors (float32 on the CPU, rows dense per head)."""
        return _cpu_f32(q, keys) and keys.stride(-1) == 1 and keys.stride(-2) == keys.shape[-1]

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        """One query per sequence: q `[B, H, D]` over rows `[>= B, KV, capacity, D]` (keys and values with the same
        strides), sequence b attending to its first `lengths[b]` positions. Returns `[B, H, D]`; ValueError for
        tensors the kernel cannot read (`supports`, head sizes that differ) or lengths outside 1..capacity."""
        b, h, d = q.shape
        if keys.stride() != values.stride() or keys.shape != values.shape or keys.shape[0] < b:
            raise ValueError(f"key and value rows must match and hold {b} sequences: {tuple(keys.shape)}")
        if not (self.supports(q, keys) and _cpu_f32(values) and keys.shape[-1] == d):
            raise ValueError(_unreadable(q, keys, values, d))
        if len(lengths) != b:
            raise ValueError(f"{b} queries need {b} lengths, got {len(lengths)}")
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

    def attend_pages(
        self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, table: torch.Tensor, start: int
    ) -> torch.Tensor:
        """Queries q `[n, H, D]` of one sequence, at positions `start .. start + n - 1` (causal), over its K/V read
        in place from one layer's pages `[N, P, KV, D]` through `table` (int64 block ids, covering every position).
        Returns `[n, H, D]`. Raises ValueError for pages whose rows are not dense, tensors the kernel cannot read
        (not float32 on the CPU, head sizes that differ), or a table that does not hold the positions within the
        pool."""
        n, h, d = q.shape
        blocks, page, kvh, _ = k_pages.shape
        if k_pages.stride() != v_pages.stride() or k_pages.shape != v_pages.shape or not self.supports_pages(k_pages):
            raise ValueError(f"key and value pages must match with dense rows: {tuple(k_pages.shape)}")
        if not (_cpu_f32(q, v_pages) and k_pages.shape[-1] == d):  # supports_pages checked k_pages
            raise ValueError(_unreadable(q, k_pages, v_pages, d))
        if table.dim() != 1 or table.dtype not in _INDEX_DTYPES:
            raise ValueError(f"the block table must be 1-D integer ids, got {table.dtype} {tuple(table.shape)}")
        if not 0 <= start <= _INT_MAX - n:  # the kernel takes C ints: a larger start would wrap around
            raise ValueError(f"start {start} is out of range for {n} queries")
        q = q.contiguous()
        table = table.to(torch.int64).contiguous()
        out = torch.empty_like(q)
        status = self._lib.native_paged_attention(
            q.data_ptr(), n, h, kvh, d, k_pages.data_ptr(), v_pages.data_ptr(), k_pages.stride(0), k_pages.stride(1),
            page, table.data_ptr(), table.numel(), blocks, start, out.data_ptr(),
        )  # fmt: skip
        if status != 0:
            raise ValueError(f"native_paged_attention refused {n} queries at {start} over table {table.tolist()}")
        return out

    @staticmethod
    def supports_pages(k_pages: torch.Tensor) -> bool:
        """Whether `attend_pages` reads these pages `[N, P, KV, D]`: float32 on the CPU, each position's heads dense."""
        _, _, kvh, d = k_pages.shape
        dense = k_pages.stride(-1) == 1 and k_pages.stride(-2) == d and k_pages.stride(1) == kvh * d
        return _cpu_f32(k_pages) and dense

    def rope_store(
        self,
        qkv: torch.Tensor,
        heads: int,
        positions: torch.Tensor,
        tables: tuple[torch.Tensor, torch.Tensor],
        pool_kv: tuple[torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        mirror_kv: tuple[torch.Tensor, torch.Tensor],
        mirror_at: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """decode_store.c: RoPE of the q and k heads of qkv `[T, (H + 2 KV) * D]` at `positions` (`tables`: cos and
        signed sin, `[max_position, D]`), k and v stored at the pool's flat `slots` (`pool_kv`: one layer's K and
        V, `[blocks, page, KV, D]`) and in the mirror's rows (`mirror_kv`: `[rows, KV, capacity, D]`) at
        `mirror_at` (row and position of each batch element). Returns q `[T, H, D]`. The int64 index tensors and
        every float32 tensor must be contiguous on the CPU (the caller checks once per pass)."""
        pool_k, pool_v = pool_kv
        mirror_k, mirror_v = mirror_kv
        rows, cos = qkv.shape[0], tables[0]
        kv_heads, d = pool_k.shape[-2], pool_k.shape[-1]
        q = torch.empty(rows, heads, d)
        status = self._lib.native_rope_store(
            qkv.data_ptr(), rows, heads, kv_heads, d, positions.data_ptr(), cos.data_ptr(), tables[1].data_ptr(),
            cos.shape[0], q.data_ptr(), pool_k.data_ptr(), pool_v.data_ptr(), slots.data_ptr(),
            pool_k.numel() // (kv_heads * d), mirror_k.data_ptr(), mirror_v.data_ptr(), mirror_k.stride(0),
            mirror_k.stride(1), mirror_at[0].data_ptr(), mirror_at[1].data_ptr(), mirror_k.shape[0], mirror_k.shape[2],
        )  # fmt: skip
        if status != 0:
            raise ValueError(f"native_rope_store refused positions, slots or mirror places for {rows} rows")
        return q

    def fill_mirror(
        self,
        pool: torch.Tensor,
        mirror_k: Sequence[torch.Tensor],
        mirror_v: Sequence[torch.Tensor],
        row: int,
        table: Sequence[int],
        n: int,
        threads: int,
    ) -> bool:
        """mirror_fill.c: positions `0 .. n - 1` of one sequence (its page ids `table`) copied from the pool's K/V
        (`pool`: `[layers, 2, blocks, page, KV, D]`) into row `row` of every layer's mirror (`[rows, KV, capacity,
        D]`), in one call on `threads` threads. False, with nothing copied, where the kernel does not take these
        tensors (not float32 on the CPU, not dense): the caller copies them itself. ValueError for a table that
        does not hold the positions within the pool, or a row or length outside the mirror."""
        tensors = (pool, *mirror_k, *mirror_v)
        if pool.dim() != 6 or not _cpu_f32(*tensors) or not all(t.is_contiguous() for t in tensors):
            return False
        layers, _, blocks, page, kvh, d = pool.shape
        shape = mirror_k[0].shape
        if len(mirror_k) != layers or len(mirror_v) != layers or any(t.shape != shape for t in tensors[1:]):
            return False
        if shape[1] != kvh or shape[3] != d:
            return False
        if not 0 <= row < shape[0]:
            raise ValueError(f"mirror row {row} is outside its {shape[0]} rows")
        ids = (ctypes.c_int64 * len(table))(*table)
        rows_k = (ctypes.c_void_p * layers)(*(t[row].data_ptr() for t in mirror_k))
        rows_v = (ctypes.c_void_p * layers)(*(t[row].data_ptr() for t in mirror_v))
        status = self._lib.native_mirror_fill(
            pool[0, 0].data_ptr(), pool[0, 1].data_ptr(), pool.stride(0), layers, blocks, page, kvh, d, ids,
            len(table), n, rows_k, rows_v, shape[2], threads,
        )  # fmt: skip
        if status != 0:
            raise ValueError(f"native_mirror_fill refused {n} positions over pages {list(table)} of {blocks}")
        return True


def _cpu_f32(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)


def _unreadable(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, head_dim: int) -> str:
    """Why the attention kernels cannot read these (they read every tensor as float32 rows of q's head size, each
    head's rows dense)."""
    if not _cpu_f32(q, keys, values):
        got = ", ".join(f"{t.dtype} on {t.device}" for t in (q, keys, values))
        return f"native attention takes float32 CPU queries, keys and values; got {got}"
    if keys.shape[-1] != head_dim:
        return f"queries of head size {head_dim} cannot attend to keys of head size {keys.shape[-1]}"
    return f"key and value rows must be dense per head: strides {keys.stride()}"
