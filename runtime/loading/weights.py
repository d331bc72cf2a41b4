"""The weight names and shapes a ModelConfig implies (Hugging Face names, [out, in] layout), and a check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixcache.runtime.config import ModelConfig


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight a Llama-family model of `config` needs, by Hugging Face name, with its shape."""
    h, q_out, kv_out = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not config.tie_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q_out, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv_out, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv_out, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, q_out)
        if config.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q_out,)
            shapes[p + "self_attn.k_proj.bias"] = (kv_out,)
            shapes[p + "self_attn.v_proj.bias"] = (kv_out,)
        shapes[p + "mlp.gate_proj.weight"] = (config.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (config.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, config.intermediate_size)
    return shapes


def check_weights(config: ModelConfig, weights: Mapping[str, Any], source: str = "model") -> None:
    """Raise ValueError unless `weights` holds exactly the expected names with the expected shapes."""
    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} weights, e.g. {missing[:3]}")
    if extra:
        problems.append(f"unexpected {len(extra)} weights, e.g. {extra[:3]}")
    for name, shape in expected.items():
        if name in weights and tuple(weights[name].shape) != shape:
            problems.append(f"{name} has shape {tuple(weights[name].shape)}, expected {shape}")
    if problems:
        raise ValueError(f"{source}: weights do not match the config: " + "; ".join(problems[:5]))
