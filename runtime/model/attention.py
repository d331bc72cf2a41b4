"""Attention over the paged KV pool: prefill (new tokens over cached prefix + themselves) and batched decode.

Grouped-query attention is native: the `num_heads` query heads are viewed as `[kv_heads, group]` so that each
KV head is read once for its whole group. Repeated KV heads are never materialised.

Prefill on the CPU (`split_prefill_attention`) runs flash-attention calls merged by their log-sum-exp: the
chunk's queries over its own keys with `is_causal` (no mask is built and the kernel skips the blocks above the
diagonal), and over the cached prefix read in place, one unmasked call per run of pages of the pool
(model.prefix_pages: every query sees all of the prefix, in any order). Other devices take `prefill_attention`,
one SDPA call with an additive causal mask over the sequence gathered from the pool.

Per-forward metadata (block tables, lengths, masks) travels in small frozen objects built once per forward
and passed down explicitly: there is no global attention context.

Decode of one sequence on the CPU reads its pages in place: a decode query attends to every cached key, and
softmax attention does not depend on the order of the keys, so the full pages are grouped into runs of
consecutive block ids (in any order), each run is a view of the pool, and the partial last page is one more.
SDPA runs on each view and the partial results are merged by their log-sum-exp (as flash-decoding does). A
table that splits into more than `MAX_RUNS` runs, a batch, or a GPU take the gather path (one `index_select`
per layer for K and for V: a copy of the sequence's KV, never of the pool). The Engine on the CPU usually takes
neither: radixcache.runtime.kv.mirror keeps the decode batch's KV contiguous, and attention reads that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from radixcache.runtime.kv.pool import gather_pages
from radixcache.runtime.model.prefix_pages import PrefixPlan

MAX_RUNS = 4  # beyond this many views a step costs more in SDPA calls than one gather copy saves


@dataclass(frozen=True, slots=True)
class PrefillMeta:
    """One sequence's chunk of new tokens at positions `start .. start + num_new - 1`.

    block_table: `[>= ceil((start + num_new) / page_size)]` int64 block ids of the sequence, on the device.
    slots: `[num_new]` flat pool slots where the new tokens' K/V are written.
    prefix: on the CPU, where positions `< start` lie in the pool (model.prefix_pages: read in place); None where
    the prefix is gathered (off the CPU) or empty.
    """

    start: int
    num_new: int
    block_table: torch.Tensor
    slots: torch.Tensor
    prefix: PrefixPlan | None = None

    @property
    def total(self) -> int:
        return self.start + self.num_new


class DecodeMeta:
    """One new token for each of B sequences of different lengths (build it with `build_decode_meta`).

    lengths: tokens per sequence including the new one (host ints). positions_t: `[B]` int64 positions of the new
    tokens (`lengths - 1`) on the device; slots: `[B]` their flat pool slots (both views of one tensor, made in one
    call). What only the paged and gather paths read is made on first use, from the host lists: block_tables
    (`[B, max_blocks]` int64, rows padded with a valid block id, masked out), mask (`[B, 1, 1, S]` bool, True =
    attend; None when B == 1) and runs (for one sequence on the CPU, its KV as `(first block id, blocks, tokens)`
    views of the pool, see the module docstring; None where the gather path runs). A decode over the mirror
    (runtime.kv.mirror) reads none of them. Measured with the caches cold, as they are between a step's weight
    streams: the whole build takes 74 us instead of 81 (a SmolLM2-sized table of 38 pages): small, since any
    tensor call made cold costs tens of microseconds.
    """

    __slots__ = ("_device", "_in_place", "_made", "_page_size", "_rows", "lengths", "positions_t", "slots")

    def __init__(
        self,
        rows: list[list[int]],
        lengths: tuple[int, ...],
        positions_t: torch.Tensor,
        slots: torch.Tensor,
        page_size: int,
        device: torch.device,
    ) -> None:
        self.lengths = lengths
        self.positions_t = positions_t
        self.slots = slots
        self._rows = rows  # padded block ids per sequence (host ints)
        self._page_size = page_size
        self._device = device
        self._in_place = reads_pages_in_place(device)  # decided when built, as the paths that read runs decide
        self._made: dict[str, object] = {}

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def block_tables(self) -> torch.Tensor:
        if "tables" not in self._made:
            self._made["tables"] = torch.tensor(self._rows, dtype=torch.int64, device=self._device)
        return self._made["tables"]  # type: ignore[return-value]

    @property
    def mask(self) -> torch.Tensor | None:
        if len(self.lengths) == 1:
            return None
        if "mask" not in self._made:
            span = torch.arange(len(self._rows[0]) * self._page_size, device=self._device)
            lengths_t = torch.tensor(self.lengths, dtype=torch.int64, device=self._device)
            self._made["mask"] = (span.unsqueeze(0) < lengths_t.unsqueeze(1)).view(len(self.lengths), 1, 1, -1)
        return self._made["mask"]  # type: ignore[return-value]

    def without_runs(self) -> DecodeMeta:
        """The same step with `runs` None: the gather path reads it (tests compare the two paths)."""
        meta = DecodeMeta(self._rows, self.lengths, self.positions_t, self.slots, self._page_size, self._device)
        meta._in_place = False
        return meta

    @property
    def runs(self) -> tuple[tuple[int, int, int], ...] | None:
        if len(self.lengths) != 1 or not self._in_place:
            return None
        if "runs" not in self._made:
            self._made["runs"] = page_runs(self._rows[0], self.lengths[0], self._page_size)
        return self._made["runs"]  # type: ignore[return-value]


def build_decode_meta(
    block_tables: Sequence[Sequence[int]], lengths: Sequence[int], page_size: int, device: torch.device
) -> DecodeMeta:
    """Metadata for one decode step. `lengths[i]` counts sequence i's tokens including the one being decoded."""
    if len(block_tables) != len(lengths) or not lengths:
        raise ValueError("decode needs one block table per sequence and at least one sequence")
    max_blocks = max(-(-n // page_size) for n in lengths)
    rows = []
    for table, n in zip(block_tables, lengths, strict=True):
        need = -(-n // page_size)
        if len(table) < need:
            raise ValueError(f"block table of {len(table)} pages cannot hold {n} tokens at page_size {page_size}")
        row = list(table[:need])
        rows.append(row + [row[0]] * (max_blocks - need))
    # the new tokens' positions and pool slots from the host lists: one tensor made, two views of it
    positions = [n - 1 for n in lengths]
    new_slots = [row[p // page_size] * page_size + p % page_size for row, p in zip(rows, positions, strict=True)]
    positions_t, slots = torch.tensor([positions, new_slots], dtype=torch.int64, device=device).unbind()
    return DecodeMeta(rows, tuple(lengths), positions_t, slots, page_size, device)


def reads_pages_in_place(device: torch.device) -> bool:
    """Whether one sequence's decode on `device` reads its pages in place (`page_runs`, with the CPU's flash kernel
    per run); elsewhere it takes the gather path. Only the device decides: tests of the gather path patch this."""
    return device.type == "cpu"


def uses_split_prefill(device: torch.device) -> bool:
    """Whether a prefill chunk on `device` runs `split_prefill_attention` (the CPU's flash kernel: two calls merged
    by log-sum-exp, no mask); elsewhere it runs `prefill_attention`, one SDPA call with `causal_mask`'s additive
    mask over the whole gathered sequence. Only the device decides: tests of the masked path patch this."""
    return device.type == "cpu"


def page_runs(table: list[int], length: int, page_size: int) -> tuple[tuple[int, int, int], ...] | None:
    """The first `length` positions of a sequence as `(first block id, blocks, tokens)` runs of the pool, or None
    past `MAX_RUNS`. Full pages are sorted by id and grouped where ids are consecutive; the partial last page (if
    any) is a run of its own, so that no run holds a position past the sequence's end."""
    full, rest = divmod(length, page_size)
    ids = sorted(table[:full])
    runs: list[tuple[int, int, int]] = []
    for block in ids:
        if runs and runs[-1][0] + runs[-1][1] == block:
            first, count, _ = runs[-1]
            runs[-1] = (first, count + 1, (count + 1) * page_size)
        else:
            runs.append((block, 1, page_size))
    if rest:
        runs.append((table[full], 1, rest))
    return tuple(runs) if len(runs) <= MAX_RUNS else None


def causal_mask(
    start: int, num_new: int, total: int, group: int, device: torch.device, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """`[group * num_new, total]` additive mask: query t (at position start + t) sees keys 0 .. start + t.

    Built once per chunk in the model's dtype (0 or -inf), so that no layer converts a boolean mask again.
    """
    q_pos = torch.arange(start, start + num_new, device=device).unsqueeze(1)
    k_pos = torch.arange(total, device=device).unsqueeze(0)
    mask = torch.zeros(num_new, total, dtype=dtype, device=device).masked_fill_(k_pos > q_pos, float("-inf"))
    return mask.repeat(group, 1)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """Causal GQA for one sequence. q `[T, H, D]`; k, v `[S, KV, D]` (cached prefix + new); mask from causal_mask.

    Returns `[T, H, D]`. Query heads are grouped as `[KV, group * T, D]` so each KV head serves its group. The
    CPU uses `split_prefill_attention` instead; this masked form serves other devices.
    """
    t, h, d = q.shape
    kvh = k.shape[1]
    g = h // kvh
    qg = q.view(t, kvh, g, d).permute(1, 2, 0, 3).reshape(1, kvh, g * t, d)
    # 4-D inputs: PyTorch's fused (flash) kernels take only those; 3-D falls back to the slow math path.
    out = F.scaled_dot_product_attention(qg, k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask)
    return out.view(kvh, g, t, d).permute(2, 0, 1, 3).reshape(t, h, d)


def split_prefill_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_prefix: torch.Tensor | None = None,
    v_prefix: torch.Tensor | None = None,
    *,
    pieces: Sequence[tuple[torch.Tensor, torch.Tensor]] = (),
) -> torch.Tensor:
    """Causal attention of a chunk's queries q `[T, H, D]` over a cached prefix and over the chunk's own keys
    `[T, KV, D]`, on the CPU. Returns `[T, H, D]`.

    The prefix is `k_prefix`/`v_prefix` `[S, KV, D]` (None if empty) and/or `pieces`, `(k, v)` pairs `[S_i, KV, D]`
    holding its positions in any order (views of the pool read in place: model.prefix_pages). Each part runs as
    its own flash-attention call and all are merged by their log-sum-exp: the chunk's part with `is_causal` (the
    kernel skips the blocks above the diagonal, so no mask is built or added), the prefix's parts unmasked (every
    query sees all of the prefix, and softmax does not depend on the order of the keys). The kernel reads
    grouped-query KV heads natively; nothing is repeated.
    """
    qh = q.transpose(0, 1).unsqueeze(0)
    parts = [_flash(qh, k_new, v_new, causal=True)]
    prefix = [(k_prefix, v_prefix)] if k_prefix is not None and v_prefix is not None else []
    for k, v in (*prefix, *pieces):
        if k.shape[0]:
            parts.append(_flash_grouped(q, k, v))
    out, lse = parts[0]
    if len(parts) == 2:
        out_p, lse_p = parts[1]
        total = torch.logaddexp(lse, lse_p)
        out = out * torch.exp(lse - total).unsqueeze(-1) + out_p * torch.exp(lse_p - total).unsqueeze(-1)
    elif len(parts) > 2:
        total = torch.stack([lse_i for _, lse_i in parts]).logsumexp(dim=0)
        out = out * torch.exp(lse - total).unsqueeze(-1)
        for out_i, lse_i in parts[1:]:
            out = out + out_i * torch.exp(lse_i - total).unsqueeze(-1)
    if len(parts) > 1:
        out = out.to(q.dtype)  # the log-sum-exps are float32 whatever the model's dtype
    return out[0].transpose(0, 1)


def _flash_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention of q `[T, H, D]` over k, v `[S, KV, D]`, as `_flash(qh, k, v, causal=False)` gives it:
    (out `[1, H, T, D]`, lse `[1, H, T]`), with the query heads of each KV head stacked as one block of
    `group * T` rows (no mask, so a row's place does not matter). PyTorch's kernel then tiles more rows at a time
    and reads each KV head once per tile of its group rather than once per query head: SmolLM2's 64-token
    question over 496 and 4,000 positions, 4-7% faster a layer. The kernel tiles the rows differently, so a
    row may differ from the head-by-head run in its last bits (tests/runtime/engine/test_attention.py)."""
    t, h, d = q.shape
    kvh = k.shape[1]
    if h == kvh:
        return _flash(q.transpose(0, 1).unsqueeze(0), k, v, causal=False)
    g = h // kvh
    qg = q.reshape(t, kvh, g, d).permute(1, 2, 0, 3).reshape(1, kvh, g * t, d)  # row j * T + i: head KV * g + j
    out, lse = _flash(qg, k, v, causal=False)
    return out.reshape(1, h, t, d), lse.reshape(1, h, t)


def _flash(qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's CPU flash attention on qh `[1, H, T, D]` and k, v `[S, KV, D]`: (out `[1, H, T, D]`, lse).

    The op takes any strides but assumes the last axis dense (it does not check): a one-row chunk's v is a
    slice of a transposed product, with a last-axis stride of 2, so such inputs are made dense first.
    """
    qh, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (qh, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qh, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0), is_causal=causal
    )
    return out, lse


def decode_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    meta: DecodeMeta,
) -> torch.Tensor:
    """One query token per sequence over its pages. q `[B, H, D]`; pages `[N, P, KV, D]`. Returns `[B, H, D]`.

    Each sequence's pages are gathered through its block table (a copy of that sequence's KV only, never of
    the pool). The group of query heads sharing a KV head plays the role of the query-length axis.
    """
    b, h, d = q.shape
    _, p, kvh, _ = k_pages.shape
    g = h // kvh
    if meta.runs is not None and b == 1:
        return _attend_runs(q.view(1, kvh, g, d), k_pages, v_pages, meta.runs).reshape(1, h, d)
    if b == 1:
        length = meta.lengths[0]
        k = gather_pages(k_pages, meta.block_tables[0], length).transpose(0, 1).unsqueeze(0)
        v = gather_pages(v_pages, meta.block_tables[0], length).transpose(0, 1).unsqueeze(0)
    else:
        m = meta.block_tables.shape[1]
        flat = meta.block_tables.flatten()  # index_select: several times faster than advanced indexing on CPU
        k = k_pages.index_select(0, flat).view(b, m * p, kvh, d).transpose(1, 2)
        v = v_pages.index_select(0, flat).view(b, m * p, kvh, d).transpose(1, 2)
    qg = q.view(b, kvh, g, d)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=meta.mask)
    return out.reshape(b, h, d)


def _attend_runs(
    qg: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, runs: tuple[tuple[int, int, int], ...]
) -> torch.Tensor:
    """Attention of qg `[1, KV, G, D]` over the pool views in `runs`, merged by log-sum-exp. No KV is copied."""
    _, p, kvh, d = k_pages.shape
    outs, lses = [], []
    for first, count, tokens in runs:
        k = k_pages[first : first + count].view(count * p, kvh, d)[:tokens].transpose(0, 1).unsqueeze(0)
        v = v_pages[first : first + count].view(count * p, kvh, d)[:tokens].transpose(0, 1).unsqueeze(0)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qg, k, v)
        outs.append(out)
        lses.append(lse)
    if len(outs) == 1:
        return outs[0]
    total = torch.stack(lses).logsumexp(dim=0)
    merged = outs[0] * torch.exp(lses[0] - total).unsqueeze(-1)
    for out, lse in zip(outs[1:], lses[1:], strict=True):
        merged = merged + out * torch.exp(lse - total).unsqueeze(-1)
    return merged.to(qg.dtype)  # the log-sum-exps are float32 whatever the model's dtype
