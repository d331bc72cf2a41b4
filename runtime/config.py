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
