"""Model GGUF files written with the `gguf` package's writer (an independent implementation of the format), for
the K-quant tests: Hugging Face-named float32 weights in, a llama.cpp-style file out (Q/K rows permuted for
llama, each 2-D weight in the block kind `kind_of` picks; 1-D weights F32).

`q4_k_m_kind` is llama.cpp's Q4_K_M recipe in short: Q4_K, Q6_K for attn_v / ffn_down of every other layer and
for the output (token embedding), each with llama.cpp's fallback where a row is not whole super-blocks of 256
(Q4_K -> Q5_0, Q6_K -> Q8_0), which is what SmolLM2's 576-wide rows get.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.loading.gguf_model import _GLOBAL_NAMES, _LAYER_NAMES
from tests.runtime.loading.kquants import quantize

_GGUF_GLOBAL = {hf: g for g, hf in _GLOBAL_NAMES.items()}
_GGUF_LAYER = {hf: g for g, hf in _LAYER_NAMES.items()}
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def gguf_name(hf: str) -> str:
    if hf in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[hf]
    layer, rest = hf.removeprefix("model.layers.").split(".", 1)
    return f"blk.{layer}.{_GGUF_LAYER[rest]}"


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter's Q/K row order (runtime.loading.gguf_model.unpermute_rope_rows inverts it)."""
    head_dim = w.shape[0] // n_heads
    return np.ascontiguousarray(w.reshape(n_heads, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def fit(kind: str, cols: int) -> str:
    """`kind`, or llama.cpp's fallback where a row is not whole blocks of it."""
    return FALLBACK[kind] if kind.endswith("_K") and cols % 256 else kind


def q4_k_m_kind(name: str, w: np.ndarray, num_layers: int) -> str:
    if name == "model.embed_tokens.weight" or name == "lm_head.weight":
        return fit("Q6_K", w.shape[1])
    layer = int(name.split(".")[2])
    six = (name.endswith("v_proj.weight") or name.endswith("down_proj.weight")) and layer % 2 == 0
    return fit("Q6_K" if six else "Q4_K", w.shape[1])


def write_model_gguf(
    path: str | Path,
    config: ModelConfig,
    weights: dict[str, np.ndarray],
    kind_of: Callable[[str, np.ndarray], str],
    tokenizer_meta: dict[str, Any],
    extra_meta: dict[str, Any] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> dict[str, str]:
    """Write the model; returns the block kind each 2-D weight got (by Hugging Face name). `extra_meta` (more
    metadata, e.g. RoPE scaling) and `extra_tensors` (arrays under their GGUF names, e.g. rope_freqs.weight)
    are written as they are."""
    a = config.arch
    w = gguf.GGUFWriter(str(path), a)
    for key, value in {
        "block_count": config.num_layers,
        "context_length": config.max_position,
        "embedding_length": config.hidden_size,
        "feed_forward_length": config.intermediate_size,
        "attention.head_count": config.num_heads,
        "attention.head_count_kv": config.num_kv_heads,
        "rope.dimension_count": config.head_dim,
    }.items():
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.rope.freq_base", config.rope_theta)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    for key, value in {**tokenizer_meta, **(extra_meta or {})}.items():  # plain values, or numpy ones as read
        value = value.item() if isinstance(value, np.generic) else value
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value) if value >= 0 else w.add_int32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, [v.item() if isinstance(v, np.generic) else v for v in value])
    kinds = {}
    for name, x in weights.items():
        x = np.ascontiguousarray(x, dtype=np.float32)
        if a in ("llama", "mistral") and ".self_attn.q_proj." in name:
            x = permute_rope_rows(x, config.num_heads)
        elif a in ("llama", "mistral") and ".self_attn.k_proj." in name:
            x = permute_rope_rows(x, config.num_kv_heads)
        if x.ndim == 1:
            w.add_tensor(gguf_name(name), x)
            continue
        kinds[name] = kind_of(name, x)
        w.add_tensor(gguf_name(name), quantize(x, kinds[name]), raw_dtype=gguf.GGMLQuantizationType[kinds[name]])
    for name, x in (extra_tensors or {}).items():
        w.add_tensor(name, np.ascontiguousarray(x))  # float32 unless a test means another type
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return kinds
