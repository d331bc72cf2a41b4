"""A plain reference forward pass: whole sequence, contiguous KV, no pages, no fusion, no cleverness.

Written apart from radixcache.runtime.model.llama (it shares no code with it) so that tests can use it as an independent
expectation. Slow by design: every call recomputes the whole sequence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from radixcache.runtime.config import ModelConfig


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    acc = x.to(torch.promote_types(x.dtype, torch.float32))
    var = (acc * acc).mean(dim=-1, keepdim=True)
    return w * (acc / torch.sqrt(var + eps)).to(x.dtype)


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE. x `[heads, T, D]`."""
    d = x.shape[-1]
    freq = theta ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2.0 / d)
    angle = positions.to(torch.float64)[:, None] * freq[None, :]  # [T, D/2]
    cos = torch.cos(angle).to(x.dtype)
    sin = torch.sin(angle).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def reference_logits(
    config: ModelConfig,
    weights: dict[str, torch.Tensor],
    token_ids: Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Logits `[T, vocab]` (float32) of every position of `token_ids`, computed in one plain pass.

    `dtype=torch.float64` gives an expectation whose own rounding error is negligible next to a float32 run.
    """
    c = config

    def w(name: str) -> torch.Tensor:
        return weights[name].to(dtype)

    ids = torch.tensor(list(token_ids), dtype=torch.long)
    t = len(ids)
    positions = torch.arange(t)
    x = w("model.embed_tokens.weight")[ids]
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        h = _rms(x, w(p + "input_layernorm.weight"), c.rms_norm_eps)
        proj = {}
        for name in ("q", "k", "v"):
            y = h @ w(p + f"self_attn.{name}_proj.weight").T
            if p + f"self_attn.{name}_proj.bias" in weights:
                y = y + w(p + f"self_attn.{name}_proj.bias")
            heads = c.num_heads if name == "q" else c.num_kv_heads
            proj[name] = y.view(t, heads, c.head_dim).transpose(0, 1)  # [heads, T, D]
        q = _rotate(proj["q"], positions, c.rope_theta)
        k = _rotate(proj["k"], positions, c.rope_theta)
        v = proj["v"]
        rep = c.num_heads // c.num_kv_heads
        k = k.repeat_interleave(rep, dim=0)  # fine here: the reference favours plainness over memory
        v = v.repeat_interleave(rep, dim=0)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(c.head_dim)
        scores = scores.masked_fill(future, float("-inf"))
        probs = torch.softmax(scores.to(torch.promote_types(dtype, torch.float32)), dim=-1)
        attn = probs.to(dtype) @ v  # [heads, T, D]
        attn = attn.transpose(0, 1).reshape(t, c.num_heads * c.head_dim)
        x = x + attn @ w(p + "self_attn.o_proj.weight").T
        h = _rms(x, w(p + "post_attention_layernorm.weight"), c.rms_norm_eps)
        gate = h @ w(p + "mlp.gate_proj.weight").T
        up = h @ w(p + "mlp.up_proj.weight").T
        x = x + (torch.nn.functional.silu(gate) * up) @ w(p + "mlp.down_proj.weight").T
    x = _rms(x, w("model.norm.weight"), c.rms_norm_eps)
    head = weights.get("lm_head.weight")
    if head is None or c.tie_embeddings:
        head = weights["model.embed_tokens.weight"]
    return (x @ head.to(dtype).T).float()


def reference_greedy(
    config: ModelConfig, weights: dict[str, torch.Tensor], prompt: Sequence[int], max_new_tokens: int
) -> list[int]:
    """Greedy continuation by re-running the whole sequence for every new token."""
    seq = list(prompt)
    out: list[int] = []
    for _ in range(max_new_tokens):
        nxt = int(reference_logits(config, weights, seq)[-1].argmax())
        out.append(nxt)
        seq.append(nxt)
    return out
