"""A prefill chunk's part of a pass (model.staged.RowPart): its checks, its metadata and its attention.

On the CPU a chunk attends over its cached prefix read in place from the pool (model.prefix_pages) and over itself
causally (attention.split_prefill_attention); elsewhere over the sequence gathered from the pool under an additive
causal mask (attention.prefill_attention). Metadata and mask are built once per pass, for every layer.

A chunk of a few tokens (tokens x query heads at most `native.ops.PAGED_ROWS`: the one token a prompt found whole
in the cache computes again) takes the native paged attention where the library builds (float32 on the CPU): one
call per layer that reads its sequence's K/V in place from the pages at the machine's read bandwidth. PyTorch's
flash kernel over the prefix's runs took 13 ms a pass for one query over 2,000 cached positions of SmolLM2 (more
than half a decode step, beside every running decode); the native call 4.4 ms (both measured 2026-12-05).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixcache.runtime.kv.pool import KVPool, gather_pages
from radixcache.runtime.model.attention import (
    PrefillMeta,
    causal_mask,
    prefill_attention,
    split_prefill_attention,
    uses_split_prefill,
)
from radixcache.runtime.model.batch import PrefillChunk
from radixcache.runtime.model.prefix_pages import plan_prefix, prefix_pieces
from radixcache.runtime.model.staged import LayeredModel, RowPart, check_layers
from radixcache.runtime.native.ops import PAGED_ROWS


def chunk_part(model: LayeredModel, chunk: PrefillChunk, pool: KVPool) -> RowPart:
    """`chunk`'s rows for a pass of `model`, checked: at least one token, positions within the model, a block table
    that holds them, and its layers (model.staged.check_layers)."""
    n = len(chunk.token_ids)
    if n == 0:
        raise ValueError("a prefill chunk needs at least one token")
    model.check_positions(chunk.end)
    device = model.device
    table = torch.as_tensor(chunk.block_table, dtype=torch.int64).to(device)
    if table.numel() < -(-chunk.end // pool.page_size):
        raise ValueError(f"block table of {table.numel()} pages cannot hold {chunk.end} tokens")
    layers = range(len(model.layers))
    if chunk.layers is not None:
        layers = check_layers(chunk.layers, len(model.layers), chunk.hidden, n, model.config.hidden_size)
    split = uses_split_prefill(device)
    native = getattr(model, "native", None) if split else None
    paged = native is not None and n * model.config.num_heads <= PAGED_ROWS and native.supports_pages(pool.layer(0)[0])
    meta = prefill_meta(chunk.start, n, table, chunk.block_table, pool, plan=not paged)
    mask = None
    if not split:  # the additive causal mask, once per pass; the CPU needs none
        group = model.config.num_heads // model.config.num_kv_heads
        mask = causal_mask(meta.start, meta.num_new, meta.total, group, device, model.dtype)

    if paged:
        assert native is not None

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return native.attend_pages(q, *pool.layer(layer), table, chunk.start)  # its K/V are in the pool now

    else:

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return chunk_attention(layer, q, k, v, meta, mask, pool)

    ids = torch.as_tensor(chunk.token_ids, dtype=torch.int64).to(device)
    positions = torch.arange(chunk.start, chunk.end, device=device)
    return RowPart(ids, positions, meta.slots, attend, layers, chunk.hidden)


def prefill_meta(
    start: int,
    n: int,
    table: torch.Tensor,
    block_table: Sequence[int] | torch.Tensor,
    pool: KVPool,
    *,
    plan: bool = True,
) -> PrefillMeta:
    """A chunk's metadata; on the CPU with where its cached prefix lies, planned once for every layer (unless
    `plan` is False: the native paged attention reads the block table itself)."""
    positions = torch.arange(start, start + n, device=table.device)
    prefix = None
    if plan and start > 0 and uses_split_prefill(table.device):
        ids = block_table.tolist() if isinstance(block_table, torch.Tensor) else block_table
        prefix = plan_prefix(ids, start, pool.page_size)
    return PrefillMeta(start, n, table, pool.slots(table, positions), prefix)


def chunk_attention(
    layer: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: PrefillMeta,
    mask: torch.Tensor | None,
    pool: KVPool,
) -> torch.Tensor:
    """A chunk's queries over its sequence's cached prefix and over the chunk itself (causal)."""
    if mask is None:  # the CPU: the prefix read in place from the pool, the chunk's own K/V at hand
        pieces = prefix_pieces(meta.prefix, *pool.layer(layer)) if meta.prefix is not None else []
        return split_prefill_attention(q, k, v, pieces=pieces)
    if meta.start > 0:  # the prefix comes from the pool (the new K/V were just written there)
        k_pages, v_pages = pool.layer(layer)
        k = gather_pages(k_pages, meta.block_table, meta.total)
        v = gather_pages(v_pages, meta.block_table, meta.total)
    return prefill_attention(q, k, v, mask)
