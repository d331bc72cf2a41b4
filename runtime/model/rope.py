"""Rotary position embedding (rotate-half, as Llama's) in PyTorch: the tables and their application. A decode
pass's native version is runtime/native/decode_store.c, which rounds as `_rope_signed` does."""

from __future__ import annotations

import torch

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.machine import device_memory


def rope_tables(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, `[max_position, head_dim]`, for rotate-half RoPE (each frequency appears twice). A ValueError
    naming max_position when building them would take more than the device's memory: a GGUF file's
    context_length of 2**32 asked for terabytes (a real 1M-token context takes a few GB, and is built)."""
    d = config.head_dim
    peak = config.max_position * d * 8 * 4  # float64 positions x frequencies, their doubled copy, cos and sin
    total = device_memory(torch.device(device))
    if total is not None and peak > total:
        raise ValueError(
            f"max_position {config.max_position} (the model's context length) needs {peak / 2**30:,.1f} GiB of RoPE "
            f"tables, more than the {total / 2**30:,.1f} GiB this device has"
        )
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=device) / d))
    pos = torch.arange(config.max_position, dtype=torch.float64, device=device)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[T, heads, D]`; cos, sin `[T, D]`. Rotate-half form: x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + rot * sin.unsqueeze(1)


def _rope_signed(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """`apply_rope` with the tables already `[T, 1, D]` and rotate-half's minus folded into the first half of sin
    (`-x * s == x * -s` exactly): the same numbers in fewer operations, for the per-layer call."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * signed_sin
