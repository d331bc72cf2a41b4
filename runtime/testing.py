"""Tiny random Llama-family models for tests and benchmarks (a ModelConfig and HF-named weights, no files), and a
hold on an engine's loop for tests that must queue requests together."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from radixcache.runtime.config import ModelConfig

if TYPE_CHECKING:
    from radixcache.runtime.engine.engine import Engine
    from radixcache.runtime.model.block_linear import BlockWeight


def tiny_config(**overrides: object) -> ModelConfig:
    """A small GQA model (4 query heads over 2 KV heads) that runs in milliseconds on CPU."""
    base = ModelConfig(
        arch="llama",
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position=512,
        tie_embeddings=False,
        name="tiny",
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def random_weights(config: ModelConfig, seed: int = 0, scale: float = 0.5) -> dict[str, torch.Tensor]:
    """Random float32 weights in Hugging Face names and `[out, in]` shapes, scaled so logits are well spread."""
    g = torch.Generator().manual_seed(seed)
    c = config

    def rand(*shape: int, s: float | None = None) -> torch.Tensor:
        fan_in = shape[-1]
        return torch.randn(*shape, generator=g) * (s if s is not None else scale / fan_in**0.5) * 2

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    w = {
        "model.embed_tokens.weight": rand(c.vocab_size, c.hidden_size, s=1.0),
        "model.norm.weight": norm(c.hidden_size),
    }
    if not c.tie_embeddings:
        w["lm_head.weight"] = rand(c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(c.hidden_size)
        w[p + "post_attention_layernorm.weight"] = norm(c.hidden_size)
        w[p + "self_attn.q_proj.weight"] = rand(q, c.hidden_size)
        w[p + "self_attn.k_proj.weight"] = rand(kv, c.hidden_size)
        w[p + "self_attn.v_proj.weight"] = rand(kv, c.hidden_size)
        w[p + "self_attn.o_proj.weight"] = rand(c.hidden_size, q)
        if c.attention_bias:
            w[p + "self_attn.q_proj.bias"] = rand(q, s=0.2)
            w[p + "self_attn.k_proj.bias"] = rand(kv, s=0.2)
            w[p + "self_attn.v_proj.bias"] = rand(kv, s=0.2)
        w[p + "mlp.gate_proj.weight"] = rand(c.intermediate_size, c.hidden_size)
        w[p + "mlp.up_proj.weight"] = rand(c.intermediate_size, c.hidden_size)
        w[p + "mlp.down_proj.weight"] = rand(c.hidden_size, c.intermediate_size)
    return w


@dataclass(frozen=True)
class RandomModel:
    """Stands in for a loaded model (config + weights, no tokenizer): what `Engine(model=...)` accepts."""

    config: ModelConfig
    weights: dict[str, torch.Tensor]
    tokenizer: object = None


def tiny_model(seed: int = 0, **overrides: object) -> RandomModel:
    config = tiny_config(**overrides)
    return RandomModel(config, random_weights(config, seed))


class CharTokenizer:
    """A reversible toy tokenizer: one id per character of a fixed alphabet; id 0 is a special EOS.

    Enough for tests of text prompts, stop strings and multi-turn chat on tiny random models.
    """

    alphabet = " abcdefghijklmnopqrstuvwxyz.,?!:|<>/\n0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"

    def __init__(self, vocab_size: int = 97, eos_token_id: int = 0) -> None:
        if vocab_size < len(self.alphabet) + 1:
            raise ValueError(f"vocab_size must be at least {len(self.alphabet) + 1}")
        self.vocab_size = vocab_size
        self.eos_token_ids = (eos_token_id,)
        self._ids = {ch: i + 1 for i, ch in enumerate(self.alphabet)}

    def encode(self, text: str) -> list[int]:
        return [self._ids[ch] for ch in text if ch in self._ids]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out = []
        for i in ids:
            if 1 <= i <= len(self.alphabet):
                out.append(self.alphabet[i - 1])
            elif not skip_special_tokens:
                out.append(f"<{i}>")
        return "".join(out)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        text = "".join(f"<{m['role']}>{m['content']}</>\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def random_block_weight(kind: str, rows: int, cols: int, seed: int) -> BlockWeight:
    """A `[rows, cols]` GGUF block weight (Q4_1 or Q8_0) with random float16 scales (and Q4_1 minima) and random
    nibbles or int8 values, for tests of radixcache.runtime.model.block_linear and its kernel."""
    import numpy as np

    from radixcache.runtime.model.block_linear import BLOCK, BLOCK_BYTES, BlockWeight

    rng = np.random.default_rng(seed)
    n = rows * cols // BLOCK
    if kind == "Q4_1":
        b = np.zeros(n, dtype=np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (16,))]))
        b["d"] = rng.uniform(0.001, 0.05, n).astype(np.float16)
        b["m"] = rng.normal(0, 0.2, n).astype(np.float16)
        b["qs"] = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    else:
        b = np.zeros(n, dtype=np.dtype([("d", "<f2"), ("qs", "i1", (32,))]))
        b["d"] = (rng.uniform(0.0005, 0.01, n) * rng.choice([-1, 1], n)).astype(np.float16)
        b["qs"] = rng.integers(-128, 128, (n, 32), dtype=np.int8)
    raw = np.frombuffer(b.tobytes(), dtype=np.uint8).reshape(rows, cols // BLOCK * BLOCK_BYTES[kind])
    return BlockWeight(kind, torch.from_numpy(raw.copy()), cols)


def hold_engine_loop(engine: Engine) -> Callable[[], None]:
    """Hold `engine`'s loop until the returned release is called, so that the requests queued meanwhile reach the
    scheduler together, however fast the machine runs them.

    Returns once the loop thread is inside the hold: a request queued before it got there would reach the loop
    with the hold, be added as the hold ends, and run a step alone before the others arrive."""
    gate, held = threading.Event(), threading.Event()

    def hold(_: object) -> None:
        held.set()
        gate.wait(60)

    engine._loop.call(hold)
    if not held.wait(60):
        raise TimeoutError("the engine loop never reached the hold")
    return gate.set
