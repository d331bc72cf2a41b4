"""bench_runtime.py's paged-against-contiguous phase: one decode step over paged KV (through the decode mirror,
in place, and by the gather fallback) against the same step over one contiguous run of KV."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from bench_runtime_report import row, verdict
from bench_runtime_rounds import PAGE, Settings, prompt_ids, timed

from radixcache.runtime.kv.mirror import DecodeMirror
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel


def contiguous_step(model: LlamaModel, pool: KVPool, token: int, length: int) -> torch.Tensor:
    """One decode step whose KV is one contiguous run (a single page as long as the sequence): no gather."""
    cfg = model.config
    kvh, g, d = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
    positions = torch.tensor([length - 1])

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kp, vp = pool.layer(layer)
        keys = kp[0, :length].transpose(0, 1).unsqueeze(0)
        vals = vp[0, :length].transpose(0, 1).unsqueeze(0)
        return F.scaled_dot_product_attention(q.view(1, kvh, g, d), keys, vals).reshape(1, -1, d)

    hidden = model._layers(torch.tensor([token]), positions, pool, positions, attend, False, 1)
    return model._logits(hidden, prefill=False, decode_rows=1)


PAGED_PATHS = {
    "mirror": "shuffled table, decode mirror (the Engine's path)",
    "in place": "allocator-order table: read in place (no mirror)",
    "gather": "shuffled table: gather path (no mirror: the fallback past the mirror's budget)",
}


def decode_step_costs(model: LlamaModel, ctx: int, reps: int, path: str) -> tuple[float, float, float]:
    """Seconds of one decode step at context `ctx`, paged and contiguous, and of filling the decode mirror once
    (0 for the paths without it). "mirror" and "gather" draw the block table at random from twice as many blocks;
    "in place" takes consecutive ids in descending order, as the free stack hands them out
    (radixcache.runtime.model.attention.page_runs)."""
    ids = prompt_ids(ctx, model.config.vocab_size, 5)
    n_pages = -(-ctx // PAGE)
    paged = model.new_pool(n_pages * 2, PAGE)
    if path == "in place":
        table = list(range(2 * n_pages - 1, n_pages - 1, -1))
    else:
        table = torch.randperm(n_pages * 2, generator=torch.Generator().manual_seed(0))[:n_pages].tolist()
    flat = KVPool(model.config, 1, ctx, dtype=model.dtype, device=model.device)
    with torch.inference_mode():
        model.prefill(ids[:-1], 0, table, paged)
        model.prefill(ids[:-1], 0, [0], flat)
        meta = build_decode_meta([table], [ctx], PAGE, model.device)
        fill = 0.0
        step = None
        if path == "mirror":
            t = time.perf_counter()
            rows = DecodeMirror(model.config, model.dtype, model.device, 1 << 40, native=model.native)
            step = rows.prepare([0], [table], [ctx], paged)
            fill = time.perf_counter() - t
        a = model.decode(ids[-1:], meta, paged, step)
        b = contiguous_step(model, flat, ids[-1], ctx)
        assert (a - b).abs().max().item() < 1e-3
        p = c = float("inf")
        for _ in range(reps):  # interleaved, so that machine noise hits both alike
            p = min(p, timed(lambda: model.decode(ids[-1:], meta, paged, step), 1))
            c = min(c, timed(lambda: contiguous_step(model, flat, ids[-1], ctx), 1))
    return p, c, fill


def bench_paged_vs_contiguous(model: LlamaModel, s: Settings) -> None:
    for path, label in PAGED_PATHS.items():
        for ctx in s.paged_ctx:
            paged_s, flat_s, fill_s = decode_step_costs(model, ctx, s.reps * 4, path)
            ratio = paged_s / flat_s
            fill = f"; the mirror filled once in {fill_s * 1000:.1f} ms" if path == "mirror" else ""
            row(
                f"decode step at {ctx} tokens, paged (page {PAGE}, {label}), fp32",
                f"{paged_s * 1000:.1f} ms",
                f"contiguous {flat_s * 1000:.1f} ms",
                f"{ratio:.2f}x; target <= 1.2x: {verdict(ratio <= 1.2)}{fill}",
                ratio=ratio,
                fill_ms=fill_s * 1000,
            )
