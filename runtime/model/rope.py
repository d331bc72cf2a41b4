"""Rotary position embedding (rotate-half, as Llama's) in PyTorch: the tables and their application. A decode
pass's native version is runtime/native/decode_store.c, which rounds as `_rope_signed` does."""

from __future__ import annotations

import math

import torch

from radixcache.runtime.config import ModelConfig, RopeScaling
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
    scale = 1.0
    if config.rope_scaling is not None:  # an unscaled model's tables are the numbers they always were
        inv_freq = scaled_frequencies(inv_freq, config.rope_scaling, config.rope_theta, d)
        scale = config.rope_scaling.attention_factor
    pos = torch.arange(config.max_position, dtype=torch.float64, device=device)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    if scale == 1.0:
        return emb.cos().to(dtype), emb.sin().to(dtype)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def scaled_frequencies(inv_freq: torch.Tensor, scaling: RopeScaling, theta: float, head_dim: int) -> torch.Tensor:
    """`inv_freq` (`[head_dim / 2]`, float64) under `scaling`: divided by the per-frequency factors, then
    transformed by its kind (see RopeScaling), as transformers' `_compute_*_parameters` and llama.cpp's
    `rope_yarn` compute them."""
    s = scaling
    if s.freq_factors:
        inv_freq = inv_freq / torch.tensor(s.freq_factors, dtype=inv_freq.dtype, device=inv_freq.device)
    if s.kind == "default":
        return inv_freq
    if s.kind == "linear":
        return inv_freq / s.factor
    if s.kind == "llama3":
        wavelen = 2 * math.pi / inv_freq
        low_wavelen = s.original_max_position / s.low_freq_factor  # longer waves: divided by factor
        high_wavelen = s.original_max_position / s.high_freq_factor  # shorter waves: kept
        smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        blended = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
        out = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
        return torch.where((wavelen >= high_wavelen) & (wavelen <= low_wavelen), blended, out)
    if s.kind == "yarn":
        low, high = yarn_correction_range(s, theta, head_dim)
        index = torch.arange(head_dim // 2, dtype=inv_freq.dtype, device=inv_freq.device)
        ramp = ((index - low) / (high - low if high != low else 0.001)).clamp(0, 1)  # 1: fully interpolated
        return inv_freq / s.factor * ramp + inv_freq * (1 - ramp)
    raise ValueError(f"RoPE scaling kind {s.kind!r} is not supported")


def yarn_correction_range(scaling: RopeScaling, theta: float, head_dim: int) -> tuple[float, float]:
    """The dims (as indices of frequencies) between which YaRN blends: those that turn `beta_fast` and `beta_slow`
    times within the original context."""

    def dim(rotations: float) -> float:
        return head_dim * math.log(scaling.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim(scaling.beta_fast), dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, head_dim - 1)


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
