"""End to end for the loader: a plain textbook forward pass over the loaded SmolLM2 weights answers "Paris".

This pins down everything the loader must get right at once: dequantisation, GGUF -> HF names, the [out, in]
layout, the Q/K un-permutation (a wrong one garbles attention), the tokenizer and the chat template. The forward pass
here is deliberately naive (no KV cache, repeated KV heads); the runtime's own model is tested elsewhere.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

ANSWER = "The capital of France is Paris."


def reference_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits [T, vocab] of a Llama-family decoder with rotate-half RoPE, from HF-named weights."""
    c, w = model.config, model.weights
    T, pos = len(ids), torch.arange(len(ids), dtype=torch.float64)

    def rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps) * g

    inv_freq = c.rope_theta ** (-torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim)
    ang = torch.cat([pos[:, None] * inv_freq[None]] * 2, dim=-1)
    cos, sin = ang.cos().float()[:, None], ang.sin().float()[:, None]

    def rope(x: torch.Tensor) -> torch.Tensor:
        half = c.head_dim // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    x = w["model.embed_tokens.weight"][ids]
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).view(T, c.num_heads, c.head_dim))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).view(T, c.num_kv_heads, c.head_dim))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, c.num_kv_heads, c.head_dim)
        group = c.num_heads // c.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        a = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
        x = x + a.transpose(0, 1).reshape(T, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return rms(x, w["model.norm.weight"]) @ head.T


@pytest.mark.slow
@torch.no_grad()
def test_smollm2_greedily_answers_paris(smollm2_model):
    tok = smollm2_model.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
    answer = [*tok.encode(ANSWER), tok.eos_token_ids[0]]
    # Teacher forcing: one pass over prompt + answer; greedy decoding would pick each next answer token.
    logits = reference_logits(smollm2_model, prompt + answer[:-1])
    predicted = logits[len(prompt) - 1 :].argmax(dim=-1).tolist()
    assert tok.decode(predicted) == ANSWER and predicted == answer
