"""The architecture of a Llama-family model, as every loader reports it and the model consumes it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """How a model's RoPE frequencies depart from `theta ** (-2i / head_dim)`, as its file says.

    Applied in this order (llama.cpp's, which a GGUF file with both a `rope_freqs` tensor and scaling metadata
    follows): each frequency is divided by its `freq_factors` entry (GGUF `rope_freqs.weight`, empty for none), then
    `kind` transforms the result, then cos and sin are multiplied by `attention_factor`.

    - `"default"`: no transform (only the per-frequency factors);
    - `"linear"`: every frequency divided by `factor` (positions divided by it, as transformers and llama.cpp do);
    - `"llama3"`: Llama 3.1's: wavelengths longer than `original_max_position / low_freq_factor` divided by
      `factor`, shorter than `original_max_position / high_freq_factor` kept, a smooth blend between;
    - `"yarn"`: YaRN: frequencies blended between kept and divided by `factor` by a ramp over the dims whose
      rotations within `original_max_position` fall between `beta_fast` and `beta_slow` (its ends floored and ceiled
      when `truncate`); `attention_factor` is its mscale.

    A frozen value compared whole: the disk tier's fingerprint holds its repr, so pages computed under one scaling
    are never read back under another.
    """

    kind: str = "default"  # "default", "linear", "llama3", "yarn"
    factor: float = 1.0
    original_max_position: int = 0  # the pretraining context length (llama3 and yarn)
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn
    attention_factor: float = 1.0  # cos and sin multiplied by it (YaRN's mscale)
    freq_factors: tuple[float, ...] = ()  # head_dim / 2 divisors of the frequencies, or () for none


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
    rope_scaling: RopeScaling | None = None  # None: plain RoPE (`rope_theta` alone)

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
