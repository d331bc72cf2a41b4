"""The architecture of a Llama-family model, as every loader reports it and the model consumes it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Hyper-parameters of a Llama-family decoder (Llama, SmolLM2, Qwen2, Mistral).

    Weights that go with it use Hugging Face names and layouts (`model.layers.{i}.self_attn.q_proj.weight`,
    shape [out_features, in_features]; RoPE in rotate-half form), whatever file they came from.
    """

    arch: str  # "llama", "qwen2", "mistral"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position: int = 2048
    tie_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    bos_token_id: int | None = None  # set only when the tokenizer prepends it (None for SmolLM2)
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    name: str = "model"

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Bytes of K and V per token over all layers, at `dtype_bytes` per element (4 for float32)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


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
