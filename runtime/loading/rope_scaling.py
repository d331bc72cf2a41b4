"""Scaled RoPE as checkpoints describe it -> RopeScaling (radixcache.runtime.config), checked field by field.

Hugging Face: `rope_scaling` in config.json (`rope_type`, or the older `type`), or transformers 5's
`rope_parameters` (which also carries `rope_theta`). GGUF: the `rope_freqs.weight` tensor of per-frequency divisors
(Llama 3.1's scaling as llama.cpp's converter writes it) and `{arch}.rope.scaling.*` metadata, applied together as
llama.cpp applies them. Supported: linear, llama3 (HF) / rope_freqs (GGUF), yarn. Refused with a ValueError naming
the file and the type: dynamic NTK (frequencies that change with the sequence length, so a cached prefix's K/V
would not be what a longer sequence computes) and every other kind.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from radixcache.runtime.config import RopeScaling
from radixcache.runtime.loading.weights import config_float, config_int

if TYPE_CHECKING:
    from radixcache.runtime.loading.gguf import GGUFFile

HF_KINDS = ("linear", "llama3", "yarn")
ROPE_FREQS = "rope_freqs.weight"
_WHY_NOT = {
    "dynamic": "dynamic NTK scaling changes the frequencies with the sequence length, so a cached prefix's K/V "
    "would differ from what a longer sequence computes",
}


def _refuse(where: str, key: str, kind: Any) -> ValueError:
    why = _WHY_NOT.get(kind) if isinstance(kind, str) else None
    return ValueError(
        f"{where}: {key} type {kind!r} is not supported"
        + (f" ({why})" if why else f" (supported: {', '.join(HF_KINDS)})")
    )


def hf_rope(cfg: dict[str, Any], where: str) -> tuple[float, RopeScaling | None]:
    """`rope_theta` and the scaling of a config.json (None when unscaled). ValueError naming `where` (the file)
    and the key for a type that is not supported and for a field missing, of the wrong type or out of range."""
    params = cfg.get("rope_parameters")
    theta_value = cfg.get("rope_theta")
    key = "rope_scaling"
    scaling = cfg.get("rope_scaling")
    if params is not None:
        if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
            raise ValueError(f"{where}: rope_parameters {params!r} is not supported (one dict of RoPE fields)")
        inner = params.get("rope_theta")
        if inner is not None and theta_value is not None and inner != theta_value:
            raise ValueError(f"{where}: rope_theta {theta_value!r} and rope_parameters.rope_theta {inner!r} differ")
        theta_value = inner if inner is not None else theta_value
        if scaling is not None and _kind(scaling) not in (None, "default") and _kind(scaling) != _kind(params):
            raise ValueError(f"{where}: rope_scaling {scaling!r} and rope_parameters {params!r} disagree")
        key, scaling = "rope_parameters", params
    theta = config_float(10000.0 if theta_value is None else theta_value, f"{where}: rope_theta")
    if scaling is None:
        return theta, None
    if not isinstance(scaling, dict):
        raise ValueError(f"{where}: {key} {scaling!r} is not supported (expected an object)")
    partial = scaling.get("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if partial is not None and partial != 1:
        raise ValueError(f"{where}: partial_rotary_factor {partial!r} (partial RoPE) is not supported")
    kind = _kind(scaling)
    if kind in (None, "default"):
        return theta, None
    if kind not in HF_KINDS:
        raise _refuse(where, key, kind)

    def number(name: str, default: float | None = None) -> float:
        value = scaling.get(name)
        if value is None and default is None:
            raise ValueError(f"{where}: {key}.{name} is missing (needed by {kind} scaling)")
        return config_float(default if value is None else value, f"{where}: {key}.{name}")

    def original() -> int:
        name = "original_max_position_embeddings"
        if cfg.get(name) is not None:  # transformers prefers a top-level one (Phi-3 writes it there)
            return config_int(cfg[name], f"{where}: {name}")
        if scaling.get(name) is not None:
            return config_int(scaling[name], f"{where}: {key}.{name}")
        # transformers' default for llama3 and yarn: the model's context length
        return config_int(cfg.get("max_position_embeddings") or 2048, f"{where}: max_position_embeddings")

    if kind == "linear":
        return theta, RopeScaling("linear", factor=number("factor"))
    if kind == "llama3":
        low, high = number("low_freq_factor"), number("high_freq_factor")
        if not low < high:
            raise ValueError(f"{where}: {key}.low_freq_factor {low!r} must be below high_freq_factor {high!r}")
        return theta, RopeScaling(
            "llama3", factor=number("factor"), original_max_position=original(), low_freq_factor=low,
            high_freq_factor=high,
        )  # fmt: skip
    orig = original()
    if scaling.get("factor") is None:  # transformers: the ratio of the context lengths
        longest = config_int(cfg.get("max_position_embeddings") or 2048, f"{where}: max_position_embeddings")
        factor = config_float(longest / orig, f"{where}: {key}.factor")
    else:
        factor = number("factor")
    fast, slow = number("beta_fast", 32.0), number("beta_slow", 1.0)
    if not slow < fast:
        raise ValueError(f"{where}: {key}.beta_slow {slow!r} must be below beta_fast {fast!r}")
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ValueError(f"{where}: {key}.truncate must be true or false, got {truncate!r}")
    if scaling.get("attention_factor") is not None:
        attention = number("attention_factor")
    elif scaling.get("mscale") and scaling.get("mscale_all_dim"):
        attention = _mscale(factor, number("mscale")) / _mscale(factor, number("mscale_all_dim"))
    else:
        attention = _mscale(factor, 1.0)
    return theta, RopeScaling(
        "yarn", factor=factor, original_max_position=orig, beta_fast=fast, beta_slow=slow, truncate=truncate,
        attention_factor=attention,
    )  # fmt: skip


def _kind(scaling: Any) -> Any:
    return scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else scaling


def _mscale(factor: float, mscale: float) -> float:
    """YaRN's attention scale, 0.1 * mscale * ln(factor) + 1 (1 for no stretch), as transformers computes it."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def gguf_rope_scaling(gguf: GGUFFile, arch: str, head_dim: int) -> RopeScaling | None:
    """The scaling a GGUF file's `rope_freqs.weight` and `{arch}.rope.scaling.*` metadata describe, None when
    unscaled, composed as llama.cpp's `rope_yarn` does (frequencies divided by the tensor's factors, then scaled by
    the type). ValueError naming the file and the key or tensor for what is not supported or out of range."""
    meta, path = gguf.metadata, gguf.path
    prefix = f"{arch}.rope.scaling."

    def number(name: str, default: float) -> float:
        value = meta.get(prefix + name, default)
        return float(str(np.float32(config_float(value, f"{path}: GGUF metadata {prefix}{name}"))))

    kind = meta.get(prefix + "type", "linear")  # llama.cpp's default: linear, whose factor defaults to 1
    for key in ("yarn_log_multiplier", "attn_factor", "alpha"):  # compared below: an array's == is no bool
        if isinstance(meta.get(prefix + key), (np.ndarray, list)):
            raise ValueError(f"{path}: GGUF metadata {prefix}{key} is an array, not a number")
    if prefix + "factor" in meta or f"{arch}.rope.scale_linear" not in meta:
        factor = number("factor", 1.0)
    else:  # the older key, which llama.cpp still reads when rope.scaling.factor is absent
        factor = _f32_key(meta[f"{arch}.rope.scale_linear"], path, arch)
    factors = _freq_factors(gguf, head_dim)
    if not isinstance(kind, str):
        raise ValueError(f"{path}: GGUF metadata {prefix}type is {kind!r}, not text")
    if kind in ("none", ""):
        if factor != 1.0:
            raise ValueError(f"{path}: GGUF metadata {prefix}type {kind!r} with {prefix}factor {factor} is ambiguous")
        scaling = RopeScaling("default")
    elif kind == "linear":
        scaling = RopeScaling("linear", factor=factor) if factor != 1.0 else RopeScaling("default")
    elif kind == "yarn":
        ext = meta.get(prefix + "yarn_ext_factor", -1.0)
        if not isinstance(ext, numbers.Real) or not (ext < 0 or ext == 1):
            raise ValueError(f"{path}: GGUF metadata {prefix}yarn_ext_factor {ext!r} is not supported (only 1)")
        if meta.get(prefix + "yarn_log_multiplier", 0) not in (0, 0.0):
            raise ValueError(f"{path}: GGUF metadata {prefix}yarn_log_multiplier is not supported")
        key = prefix + "original_context_length"  # llama.cpp's default: the context length
        orig = config_int(meta.get(key, meta.get(f"{arch}.context_length", 2048)), f"{path}: GGUF metadata {key}")
        fast, slow = number("yarn_beta_fast", 32.0), number("yarn_beta_slow", 1.0)
        if not slow < fast:
            raise ValueError(f"{path}: GGUF metadata {prefix}yarn_beta_slow {slow} must be below yarn_beta_fast {fast}")
        attention = number("yarn_attn_factor", 1.0) * (1.0 + 0.1 * math.log(factor))  # ggml's rope_yarn mscale
        scaling = RopeScaling(
            "yarn", factor=factor, original_max_position=orig, beta_fast=fast, beta_slow=slow,
            attention_factor=attention,
        )  # fmt: skip
    else:
        raise ValueError(
            f"{path}: GGUF metadata {prefix}type {kind!r} is not supported (linear, yarn, or a rope_freqs tensor)"
        )
    for key in ("attn_factor", "alpha"):  # other archs' knobs (an NTK alpha, a global attention factor)
        if meta.get(prefix + key, 1.0) != 1.0:
            raise ValueError(f"{path}: GGUF metadata {prefix}{key} is not supported")
    if factors:
        scaling = RopeScaling(**{**_fields(scaling), "freq_factors": factors})
    return None if scaling == RopeScaling("default") else scaling


def _f32_key(value: Any, path: str, arch: str) -> float:
    return float(str(np.float32(config_float(value, f"{path}: GGUF metadata {arch}.rope.scale_linear"))))


def _fields(scaling: RopeScaling) -> dict[str, Any]:
    return {name: getattr(scaling, name) for name in RopeScaling.__slots__}  # type: ignore[attr-defined]


def _freq_factors(gguf: GGUFFile, head_dim: int) -> tuple[float, ...]:
    """The divisors of `rope_freqs.weight` (() without one): float32, head_dim / 2 of them, each finite and > 0."""
    info = gguf.tensors.get(ROPE_FREQS)
    if info is None:
        return ()
    if info.type_name != "F32" or tuple(info.shape) != (head_dim // 2,):
        raise ValueError(
            f"{gguf.path}: tensor rope_freqs.weight is {info.type_name} of shape {tuple(info.shape)}, expected F32 of "
            f"shape ({head_dim // 2},) (head_dim / 2 frequency factors)"
        )
    values = gguf.dequantize(ROPE_FREQS)
    bad = next((float(v) for v in values if not (math.isfinite(v) and v > 0)), None)
    if bad is not None:
        raise ValueError(f"{gguf.path}: tensor rope_freqs.weight holds {bad!r}; its factors must be finite and above 0")
    return tuple(float(v) for v in values)
