"""A contiguous, head-major mirror of the decoding sequences' KV, so that decode attention copies nothing per step.

The paged pool stays the store of record: every K/V is written there first, the radix tree shares its pages, and
prefill reads it. Decode, though, reads a sequence's whole context at every step, and from pages that means
either one gather copy per layer per step (the batched path in runtime.model.attention) or several small attention
calls over runs of pages (one sequence). On this project's CPU the gather plus a masked SDPA cost about 30% of
a batch-8 step (docs/benchmarks.md).

The mirror keeps, per layer, `[rows, kv_heads, capacity, head_dim]` K and V tensors: one row per sequence of the
decode batch, its positions contiguous per KV head. A step then writes the new token's K/V into both the pool and
the row, and attention runs over the rows (two batched matrix products with a length mask, or PyTorch's CPU
flash kernel when every length is equal), with no copy of the context. A row is filled from the pool once, when
its sequence joins the batch (or comes back after a preemption, or after a failed step), and then follows it one
position per step. Memory: the batch's KV a second time, bounded by
`max_bytes`; past the bound `prepare` returns None and the caller takes the paged paths.

Invariant, checked by `prepare`: a row whose `synced` count equals the sequence's length minus one holds exactly
the pool's K/V for those positions. A step in flight marks its rows unsynced until `commit`; a step that raised
is never committed, so its rows are refilled from the pool on the next step.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.kv.pool import KVPool, gather_pages

if TYPE_CHECKING:
    from radixcache.runtime.native.ops import NativeDecodeOps

_SPAN_STEP = 256  # capacity grows in steps of this many positions: one reallocation per 256 decode steps at most


@dataclass(frozen=True, slots=True)
class MirrorStep:
    """One decode step over the mirror: which row holds each batch element, and where its new token goes.

    k, v: per layer `[row capacity, kv_heads, span capacity, head_dim]`. rows_t / positions_t: `[B]` row and
    position of each batch element's new token. order / inverse: batch index of each row and its inverse, None
    when row r holds batch element r. span: positions attended (the longest sequence). mask: `[B, 1, 1, span]`
    additive (0 / -inf) in row order, None when every sequence has the same length. row_lengths: the lengths
    in row order. native: radixcache.runtime.native.ops for the attention (quant="gguf"), else None.
    """

    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]
    rows: tuple[int, ...]
    lengths: tuple[int, ...]
    rows_t: torch.Tensor
    positions_t: torch.Tensor
    order: torch.Tensor | None
    inverse: torch.Tensor | None
    span: int
    mask: torch.Tensor | None
    row_lengths: tuple[int, ...] = ()
    native: NativeDecodeOps | None = None

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new tokens' K/V `[B, kv_heads, head_dim]` (batch order) in their rows."""
        if self.order is None and self.mask is None:  # rows 0..B-1 in batch order, one position: a plain slice
            pos = self.span - 1
            self.k[layer][: len(self.rows), :, pos].copy_(k)
            self.v[layer][: len(self.rows), :, pos].copy_(v)
            return
        self.k[layer][self.rows_t, :, self.positions_t] = k
        self.v[layer][self.rows_t, :, self.positions_t] = v

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Decode attention of q `[B, H, D]` (batch order) over the rows. Returns `[B, H, D]`.

        Grouped-query attention without repeating KV heads: the group of query heads that share a KV head is
        the row count of one small matrix product per (sequence, KV head). When every sequence has the same
        length (always at batch 1) the CPU runs PyTorch's flash kernel on the rows instead: no mask, fewer calls.
        """
        b, h, d = q.shape
        keys, values = self.k[layer][:b, :, : self.span], self.v[layer][:b, :, : self.span]  # [B, KV, span, D]
        kvh = keys.shape[1]
        g = h // kvh
        if self.order is not None:
            q = q.index_select(0, self.order)
        if self.native is not None and self.native.supports(q, self.k[layer]):
            out = self.native.attend(q, self.k[layer], self.v[layer], self.row_lengths)
            return out if self.inverse is None else out.index_select(0, self.inverse)
        if self.mask is None and q.device.type == "cpu":  # equal lengths: the CPU flash kernel, no mask to add
            out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q.contiguous().view(b, kvh, g, d), keys, values
            )[0].reshape(b, h, d)
            return out if self.inverse is None else out.index_select(0, self.inverse)
        qg = (q * (1.0 / math.sqrt(d))).view(b * kvh, g, d)
        # The row slices merge their first two axes without a copy (rows are dense).
        keys, values = keys.view(b * kvh, self.span, d), values.view(b * kvh, self.span, d)
        scores = torch.bmm(qg, keys.transpose(1, 2))
        if self.mask is not None:
            scores.view(b, kvh, g, self.span).add_(self.mask)
        probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
        out = torch.bmm(probs, values).view(b, h, d)
        return out if self.inverse is None else out.index_select(0, self.inverse)


class DecodeMirror:
    """Mirror rows for the sequences of the current decode batch (see the module docstring)."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: str | torch.device,
        max_bytes: int,
        native: NativeDecodeOps | None = None,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.num_layers = config.num_layers
        self.kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.max_bytes = max_bytes
        # radixcache.runtime.native.ops (float32 on the CPU): attention in one native call per layer, row fills in one
        self.native = native
        self.bytes_per_position = 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype.itemsize
        # tuples, replaced whole when the rows are reallocated: each step hands out the same objects, so that a
        # reader may key what it derives from them (model.native_layers' pointer tables) on their identity
        self._k: tuple[torch.Tensor, ...] = ()
        self._v: tuple[torch.Tensor, ...] = ()
        self._keys: list[Hashable] = []  # row -> the sequence it mirrors; rows are dense from 0
        self._synced: list[int] = []  # row -> positions mirrored; -1 while a step using the row is in flight
        self.positions_loaded = 0  # positions copied from the pool (row fills), for tests and metrics
        self.reallocations = 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._k, *self._v))

    @property
    def capacity(self) -> tuple[int, int]:
        """(rows, positions per row) currently allocated."""
        return (self._k[0].shape[0], self._k[0].shape[2]) if self._k else (0, 0)

    def clear(self) -> None:
        """Drop every row and free the memory."""
        self._k, self._v, self._keys, self._synced = (), (), [], []

    def prepare(
        self, keys: Sequence[Hashable], block_tables: Sequence[Sequence[int]], lengths: Sequence[int], pool: KVPool
    ) -> MirrorStep | None:
        """Rows for one decode step. `keys` name the sequences (distinct; a new key means new content),
        `lengths[i]` counts sequence i's tokens including the one being decoded. Rows of keys absent from this
        step are dropped; rows not in sync are refilled from the pool. None when the batch does not fit in
        `max_bytes`: the mirror is then cleared and the caller uses the paged paths."""
        if len(set(keys)) != len(keys):
            raise ValueError("decode keys must be distinct")
        if not keys or len(block_tables) != len(keys) or len(lengths) != len(keys):
            raise ValueError("prepare needs one key, block table and length per sequence, and at least one")
        # checked before any row moves: a length below 1 put the new token at position -1 (the row's last, by
        # wrap-around), a table short of the context failed inside a row's fill
        for n, table in zip(lengths, block_tables, strict=True):
            if n < 1 or len(table) * pool.page_size < n:
                raise ValueError(
                    f"a decode length must be 1 to its table's {len(table) * pool.page_size} positions, got {n}"
                )
        span = max(lengths)
        want = (_pow2(len(keys)), _round_up(span, _SPAN_STEP))
        if want[0] * want[1] * self.bytes_per_position > self.max_bytes:
            self.clear()
            return None
        self._drop_absent(set(keys))
        self._fit(want, len(keys), span)
        index = {key: row for row, key in enumerate(self._keys)}
        rows = []
        for key, table, n in zip(keys, block_tables, lengths, strict=True):
            row = index.get(key)
            if row is None:
                row = len(self._keys)
                self._keys.append(key)
                self._synced.append(0)
            if self._synced[row] != n - 1:
                self._load(row, table, n - 1, pool)
            self._synced[row] = -1  # in flight until commit
            rows.append(row)
        return self._step(rows, list(lengths), span)

    def commit(self, step: MirrorStep) -> None:
        """Mark the step's rows in sync: call after the forward pass that used `step` returned."""
        for row, n in zip(step.rows, step.lengths, strict=True):
            self._synced[row] = n

    # ------------------------------------------------------------------ private

    def _step(self, rows: list[int], lengths: list[int], span: int) -> MirrorStep:
        dev = self.device
        b = len(rows)
        order = inverse = None
        if rows != list(range(b)):
            inv = torch.tensor(rows, dtype=torch.int64, device=dev)  # batch index -> row
            inverse = inv
            order = torch.empty_like(inv)
            order[inv] = torch.arange(b, device=dev)  # row -> batch index
        by_row = [0] * b
        for row, n in zip(rows, lengths, strict=True):
            by_row[row] = n
        mask = None
        if min(lengths) != span:  # built even with a native kernel (which takes the lengths): the fallback needs it
            n_t = torch.tensor(by_row, device=dev)
            past = torch.arange(span, device=dev).unsqueeze(0) >= n_t.unsqueeze(1)
            mask = torch.zeros(b, span, dtype=torch.float32, device=dev).masked_fill_(past, float("-inf"))
            mask = mask.view(b, 1, 1, span)
        # one tensor made, two views of it (one tensor call fewer a step)
        rows_t, positions_t = torch.tensor([rows, [n - 1 for n in lengths]], dtype=torch.int64, device=dev).unbind()
        return MirrorStep(
            k=self._k,
            v=self._v,
            rows=tuple(rows),
            lengths=tuple(lengths),
            rows_t=rows_t,
            positions_t=positions_t,
            order=order,
            inverse=inverse,
            span=span,
            mask=mask,
            row_lengths=tuple(by_row),
            native=self.native,
        )

    def _drop_absent(self, present: set[Hashable]) -> None:
        """Free the rows of sequences not in this step, keeping rows dense: the last row moves into a hole."""
        for row in range(len(self._keys) - 1, -1, -1):
            if self._keys[row] in present:
                continue
            last = len(self._keys) - 1
            if row != last:
                n = max(self._synced[last], 0)
                for t in (*self._k, *self._v):
                    t[row, :, :n] = t[last, :, :n]
                self._keys[row], self._synced[row] = self._keys[last], self._synced[last]
            self._keys.pop()
            self._synced.pop()

    def _fit(self, want: tuple[int, int], rows: int, span: int) -> None:
        """Make room for `rows` rows of `span` positions; shrink when the allocation is over twice `want`."""
        have_rows, have_span = self.capacity
        grow = have_rows < rows or have_span < span
        shrink = have_rows * have_span > 2 * want[0] * want[1]
        if not (grow or shrink):
            return
        shape = (want[0], self.kv_heads, want[1], self.head_dim)
        keep_rows = len(self._keys)
        new_k, new_v = [], []
        for old_k, old_v in zip(self._k or [None] * self.num_layers, self._v or [None] * self.num_layers, strict=True):
            # zeros, not empty: masked positions still enter the products, and 0 * NaN garbage would be NaN
            k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            v = torch.zeros(shape, dtype=self.dtype, device=self.device)
            if old_k is not None and keep_rows:
                n = min(old_k.shape[2], want[1])
                k[:keep_rows, :, :n] = old_k[:keep_rows, :, :n]
                v[:keep_rows, :, :n] = old_v[:keep_rows, :, :n]
            new_k.append(k)
            new_v.append(v)
        self._k, self._v = tuple(new_k), tuple(new_v)
        self.reallocations += 1

    def _load(self, row: int, table: Sequence[int], n: int, pool: KVPool) -> None:
        """Copy positions `0 .. n - 1` of a sequence from the pool into `row`: one native call for every layer
        where the library takes the tensors (float32 on the CPU), on the step's torch thread count; else a gather
        and a copy per layer for K and for V (each an OpenMP region whose barrier, beside busy programs, waits for
        a descheduled thread: up to 0.95 s after a 512-token prompt on two threads beside two busy processes,
        docs/benchmarks.md)."""
        self._synced[row] = -1
        if n > 0:
            pages = list(table)[: -(-n // pool.page_size)]
            threads = torch.get_num_threads()
            if self.native is None or not self.native.fill_mirror(pool.kv, self._k, self._v, row, pages, n, threads):
                ids = torch.as_tensor(pages, dtype=torch.int64, device=self.device)
                for layer in range(self.num_layers):
                    k_pages, v_pages = pool.layer(layer)
                    self._k[layer][row, :, :n] = gather_pages(k_pages, ids, n).transpose(0, 1)
                    self._v[layer][row, :, :n] = gather_pages(v_pages, ids, n).transpose(0, 1)
            self.positions_loaded += n
        self._synced[row] = n


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step
