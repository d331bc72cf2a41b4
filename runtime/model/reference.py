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


def _frequencies(config: ModelConfig) -> tuple[list[float], float]:
    """Each pair's angle per position, and the factor cos and sin are multiplied by: plain Python floats, one
    frequency at a time, from the papers' formulas (Meta's `apply_scaling` for llama3, YaRN's Eq. 21 and its
    correction dims), apart from runtime.model.rope's tensor form."""
    d, theta, s = config.head_dim, config.rope_theta, config.rope_scaling
    base = [theta ** (-2.0 * i / d) for i in range(d // 2)]
    if s is None:
        return base, 1.0
    if s.freq_factors:  # llama.cpp's rope_freqs: the wavelength of pair i is stretched by its factor
        base = [f / k for f, k in zip(base, s.freq_factors, strict=True)]
    if s.kind == "default":
        return base, s.attention_factor
    if s.kind == "linear":
        return [f / s.factor for f in base], s.attention_factor
    out = []
    if s.kind == "llama3":
        for f in base:
            wave = 2 * math.pi / f
            if wave < s.original_max_position / s.high_freq_factor:
                out.append(f)
            elif wave > s.original_max_position / s.low_freq_factor:
                out.append(f / s.factor)
            else:
                t = (s.original_max_position / wave - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
                out.append((1 - t) * f / s.factor + t * f)
        return out, s.attention_factor
    assert s.kind == "yarn", s.kind

    def dims_turning(turns: float) -> float:  # the pair index that turns `turns` times in the original context
        return d * math.log(s.original_max_position / (2 * math.pi * turns)) / (2 * math.log(theta))

    lo, hi = dims_turning(s.beta_fast), dims_turning(s.beta_slow)
    if s.truncate:
        lo, hi = float(math.floor(lo)), float(math.ceil(hi))
    lo, hi = max(lo, 0.0), min(hi, d - 1.0)
    for i, f in enumerate(base):
        mix = min(1.0, max(0.0, (i - lo) / max(hi - lo, 0.001)))  # 0: extrapolate (keep), 1: interpolate
        out.append(f * (1 - mix) + f / s.factor * mix)
    return out, s.attention_factor


def _rotate(x: torch.Tensor, positions: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """Rotate-half RoPE. x `[heads, T, D]`."""
    d = x.shape[-1]
    freq, scale = _frequencies(config)
    angle = positions.to(torch.float64)[:, None] * torch.tensor(freq, dtype=torch.float64)[None, :]  # [T, D/2]
    cos = (torch.cos(angle) * scale).to(x.dtype)
    sin = (torch.sin(angle) * scale).to(x.dtype)
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
        q = _rotate(proj["q"], positions, c)
        k = _rotate(proj["k"], positions, c)
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
