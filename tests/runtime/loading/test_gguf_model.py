"""GGUF -> ModelConfig and Hugging Face weights: names, shapes, llama.cpp's Q/K permutation undone, tiny and real."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.loading import load_model
from radixcache.runtime.loading.gguf_model import hf_name, unpermute_rope_rows
from radixcache.runtime.loading.weights import expected_shapes


def llamacpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to Q/K rows of llama models (its definition, restated)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def inv_freq(head_dim: int, theta: float) -> np.ndarray:
    return theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def rope_rotate_half(q: np.ndarray, pos: int, theta: float) -> np.ndarray:
    """Hugging Face: pairs (i, i + d/2). q: [heads, d]."""
    ang = pos * inv_freq(q.shape[-1], theta)
    cos, sin = np.concatenate([np.cos(ang)] * 2), np.concatenate([np.sin(ang)] * 2)
    half = q.shape[-1] // 2
    rotated = np.concatenate([-q[..., half:], q[..., :half]], axis=-1)
    return q * cos + rotated * sin


def rope_interleaved(q: np.ndarray, pos: int, theta: float) -> np.ndarray:
    """llama.cpp's normal RoPE (GPT-J style): pairs (2i, 2i + 1)."""
    ang = pos * inv_freq(q.shape[-1], theta)
    even, odd = q[..., 0::2], q[..., 1::2]
    out = np.empty_like(q)
    out[..., 0::2] = even * np.cos(ang) - odd * np.sin(ang)
    out[..., 1::2] = even * np.sin(ang) + odd * np.cos(ang)
    return out


@pytest.mark.parametrize("n_heads,head_dim", [(1, 2), (3, 8), (9, 64)])
def test_unpermute_inverts_llamacpp_permutation(n_heads, head_dim):
    rng = np.random.default_rng(n_heads)
    w = rng.normal(size=(n_heads * head_dim, 5))
    np.testing.assert_array_equal(unpermute_rope_rows(llamacpp_permute(w, n_heads), n_heads), w)
    bias = rng.normal(size=(n_heads * head_dim,))
    np.testing.assert_array_equal(unpermute_rope_rows(llamacpp_permute(bias, n_heads), n_heads), bias)


def test_interleaved_rope_on_permuted_weights_is_rotate_half_rope_on_unpermuted():
    rng = np.random.default_rng(0)
    heads, kv_heads, d, hidden, theta = 4, 2, 16, 24, 1e4
    wq, wk = rng.normal(size=(heads * d, hidden)), rng.normal(size=(kv_heads * d, hidden))
    wq_gguf, wk_gguf = llamacpp_permute(wq, heads), llamacpp_permute(wk, kv_heads)
    wq_back, wk_back = unpermute_rope_rows(wq_gguf, heads), unpermute_rope_rows(wk_gguf, kv_heads)
    x_q, x_k = rng.normal(size=hidden), rng.normal(size=hidden)
    for pq, pk in [(0, 0), (5, 2), (300, 17)]:
        q_cpp = rope_interleaved((wq_gguf @ x_q).reshape(heads, d), pq, theta)
        k_cpp = rope_interleaved((wk_gguf @ x_k).reshape(kv_heads, d), pk, theta)
        q_hf = rope_rotate_half((wq_back @ x_q).reshape(heads, d), pq, theta)
        k_hf = rope_rotate_half((wk_back @ x_k).reshape(kv_heads, d), pk, theta)
        # Same vectors up to the per-head permutation, hence the same attention scores (GQA: head h uses h // 2).
        np.testing.assert_allclose(llamacpp_permute(q_hf.reshape(-1), heads), q_cpp.reshape(-1), atol=1e-9)
        scores_cpp = np.einsum("hd,hd->h", q_cpp, np.repeat(k_cpp, heads // kv_heads, axis=0))
        scores_hf = np.einsum("hd,hd->h", q_hf, np.repeat(k_hf, heads // kv_heads, axis=0))
        np.testing.assert_allclose(scores_hf, scores_cpp, atol=1e-9)


def test_gguf_tensor_names_map_to_hugging_face_names():
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
    assert hf_name("blk.12.attn_q.bias") == "model.layers.12.self_attn.q_proj.bias"
    assert hf_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj.weight"
    assert hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    with pytest.raises(ValueError, match="rope_freqs"):
        hf_name("rope_freqs.weight")
    with pytest.raises(ValueError, match="unexpected"):
        hf_name("blk.0.attn_qkv.weight")


_GGUF_OF = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_tiny_gguf(
    kit, path, cfg: ModelConfig, weights: dict[str, np.ndarray], quant: str = "F32", meta_overrides=None
) -> None:
    """Convert HF-layout weights into a GGUF file the way llama.cpp does (permuting Q/K for llama); a key of
    `meta_overrides` replaces that metadata value (None: leaves it out)."""
    tensors = []
    for name, w in weights.items():
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        elif name == "lm_head.weight":
            g = "output.weight"
        else:
            layer, rest = name.removeprefix("model.layers.").split(".", 1)
            proj = rest.removeprefix("self_attn.")
            g = f"blk.{layer}." + _GGUF_OF.get(rest, f"attn_{proj[0]}.{proj.split('.')[-1]}")
            if cfg.arch == "llama" and proj[:6] in ("q_proj", "k_proj"):
                w = llamacpp_permute(w, cfg.num_heads if proj[0] == "q" else cfg.num_kv_heads)
        ttype = quant if w.ndim == 2 else "F32"
        tensors.append((g, w.shape, ttype, kit.quantize(w, ttype)))
    a = cfg.arch
    meta = {
        "general.architecture": a,
        f"{a}.block_count": cfg.num_layers,
        f"{a}.context_length": cfg.max_position,
        f"{a}.embedding_length": cfg.hidden_size,
        f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.attention.head_count": cfg.num_heads,
        f"{a}.attention.head_count_kv": cfg.num_kv_heads,
        f"{a}.rope.freq_base": cfg.rope_theta,
        f"{a}.attention.layer_norm_rms_epsilon": cfg.rms_norm_eps,
        f"{a}.rope.dimension_count": cfg.head_dim,
        f"{a}.attention.key_length": cfg.head_dim,  # 16, not hidden / heads = 8
        f"{a}.attention.value_length": cfg.head_dim,
        **kit.tiny_tokenizer_metadata(),
    }
    meta.update(meta_overrides or {})
    meta = {key: value for key, value in meta.items() if value is not None}
    kit.write_gguf(path, meta, tensors)


def tiny_config(kit, arch: str = "llama", tie: bool = True, bias: bool = False) -> ModelConfig:
    return ModelConfig(
        arch=arch, vocab_size=len(kit.tiny_vocab()[0]), hidden_size=32, intermediate_size=64, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1e5, rms_norm_eps=1e-5, max_position=256,
        tie_embeddings=tie, attention_bias=bias, eos_token_ids=(2,), name="tiny",
    )  # fmt: skip


def random_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.normal(0, 0.3, size=s).astype(np.float32) for k, s in expected_shapes(cfg).items()}


@pytest.mark.parametrize("arch,tie,bias", [("llama", True, False), ("llama", False, False), ("qwen2", True, True)])
def test_tiny_gguf_loads_to_the_original_hugging_face_weights(kit, tmp_path, arch, tie, bias):
    cfg = tiny_config(kit, arch, tie, bias)
    weights = random_weights(cfg)
    write_tiny_gguf(kit, tmp_path / "tiny.gguf", cfg, weights)
    model = load_model(tmp_path / "tiny.gguf")
    assert model.config == cfg
    assert model.source == str(tmp_path / "tiny.gguf")
    assert set(model.weights) == set(weights)
    for name, w in weights.items():
        torch.testing.assert_close(model.weights[name], torch.from_numpy(w), rtol=0, atol=0, msg=name)
    assert model.tokenizer.decode(model.tokenizer.encode("hello world 42")) == "hello world 42"


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_1", "Q4_0"])
def test_quantised_tiny_gguf_is_unpermuted_after_dequantising(kit, tmp_path, quant):
    cfg = tiny_config(kit)
    weights = random_weights(cfg, seed=1)
    write_tiny_gguf(kit, tmp_path / "q.gguf", cfg, weights, quant=quant)
    model = load_model(tmp_path / "q.gguf", dtype="bfloat16")
    tol = {"Q8_0": 0.02, "Q4_1": 0.12, "Q4_0": 0.2}[quant]
    for name, w in weights.items():
        assert model.weights[name].dtype == torch.bfloat16
        err = (model.weights[name].float() - torch.from_numpy(w)).abs().max().item()
        assert err < tol, (name, err)


def test_unsupported_architecture_is_rejected(kit, tmp_path):
    kit.write_gguf(tmp_path / "x.gguf", {"general.architecture": "gemma"}, [])
    with pytest.raises(ValueError, match="'gemma' is not supported"):
        load_model(tmp_path / "x.gguf")


def test_smollm2_config_and_weights(smollm2_model):
    cfg = smollm2_model.config
    assert (cfg.arch, cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == ("llama", 30, 576, 1536)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (9, 3, 64, 49152)
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.tie_embeddings, cfg.attention_bias) == (1e5, 1e-5, True, False)
    assert cfg.eos_token_ids == (2,) and cfg.bos_token_id is None
    w = smollm2_model.weights
    assert "lm_head.weight" not in w and w["model.embed_tokens.weight"].shape == (49152, 576)
    assert w["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in w.values())
    some = [w["model.embed_tokens.weight"], w["model.norm.weight"], w["model.layers.29.mlp.down_proj.weight"]]
    assert all(bool(torch.isfinite(t).all()) for t in some)
