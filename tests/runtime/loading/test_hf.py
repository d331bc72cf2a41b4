"""Hugging Face directories: tiny random Llama, Qwen2 and Mistral checkpoints written here with safetensors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers, processors

from radixcache.runtime.loading import load_model
from radixcache.runtime.loading.hf import config_from_hf
from radixcache.runtime.loading.weights import expected_shapes

CHAT = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{{ eos_token }}{% endfor %}"


def hf_config(kit, model_type: str = "llama", **overrides) -> dict:
    cfg = {
        "model_type": model_type,
        "vocab_size": len(kit.tiny_vocab()[0]),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "bos_token_id": 0,
        "eos_token_id": 2,
    }
    cfg.update(overrides)
    return cfg


def write_tokenizer(kit, directory, bos: bool) -> None:
    tokens, _, merges = kit.tiny_vocab()
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = Backend(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(kit.TINY_SPECIALS)
    if bos:  # like Llama's tokenizer.json: the post-processor prepends BOS
        backend.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
        )
    backend.save(str(directory / "tokenizer.json"))


def write_checkpoint(kit, directory, cfg: dict, shards: int = 1, stored=torch.float32, bos=False, extra=None):
    """Random weights for `cfg`, saved as 1 or more safetensors shards (with an index when sharded)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = config_from_hf(cfg)
    gen = torch.Generator().manual_seed(0)
    weights = {k: torch.randn(s, generator=gen).to(stored) for k, s in expected_shapes(config).items()}
    weights.update(extra or {})
    names = sorted(weights)
    if shards == 1:
        save_file(weights, str(directory / "model.safetensors"))
    else:
        weight_map = {}
        for i in range(shards):
            shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: weights[k] for k in names[i::shards]}
            save_file(part, str(directory / shard))
            weight_map.update(dict.fromkeys(part, shard))
        (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(cfg))
    write_tokenizer(kit, directory, bos)
    return weights


def test_llama_directory_loads_config_weights_and_tokenizer(kit, tmp_path):
    cfg = hf_config(kit, head_dim=16)
    weights = write_checkpoint(kit, tmp_path / "llama", cfg, bos=True)
    (tmp_path / "llama" / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|endoftext|>", "eos_token": {"content": "<|im_end|>"}, "chat_template": CHAT})
    )
    (tmp_path / "llama" / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1]}))
    m = load_model(tmp_path / "llama")
    c = m.config
    assert (c.arch, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == ("llama", 2, 32, 4, 2, 16)
    assert (c.rope_theta, c.rms_norm_eps, c.max_position, c.tie_embeddings, c.attention_bias) == (
        5e5, 1e-6, 128, False, False,
    )  # fmt: skip
    assert c.bos_token_id == 0 and c.eos_token_ids == (2, 1) == m.tokenizer.eos_token_ids
    assert m.source == str(tmp_path / "llama") and c.name == "llama"
    assert set(m.weights) == set(weights)
    for k, w in weights.items():
        assert torch.equal(m.weights[k], w), k
    tok = m.tokenizer
    assert tok.encode("hello") == [0, *tok.encode("hello", add_special_tokens=False)]
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|endoftext|>[user]hi<|im_end|>"
    assert tok.encode(prompt).count(0) == 1  # the template's BOS is not doubled


def test_the_templates_eos_token_is_tokenizer_configs(kit, tmp_path):
    """transformers renders `eos_token` as tokenizer_config.json's; it was generation_config.json's first id."""
    write_checkpoint(kit, tmp_path / "m", hf_config(kit))
    template = "{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"
    config = {"eos_token": "<|im_end|>", "chat_template": template}
    (tmp_path / "m" / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    m = load_model(tmp_path / "m")
    assert m.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi<|im_end|>"
    assert set(m.config.eos_token_ids) == {1, 2}  # every id still ends generation


def test_sharded_checkpoint_equals_its_weights(kit, tmp_path):
    cfg = hf_config(kit)
    weights = write_checkpoint(kit, tmp_path / "sharded", cfg, shards=3)
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) == 3
    m = load_model(tmp_path / "sharded")
    assert set(m.weights) == set(weights) and all(torch.equal(m.weights[k], w) for k, w in weights.items())
    assert m.tokenizer.add_bos is False and m.config.bos_token_id is None


def test_files_beside_model_safetensors_are_not_read(kit, tmp_path):
    """Mistral's repositories ship consolidated.safetensors (the same weights under Mistral's own names) beside the
    Hugging Face files, and a fine-tuned model's folder may keep its adapter_model.safetensors: every *.safetensors
    was read, and the load failed on dozens of unexpected weights. transformers reads model.safetensors only."""
    weights = write_checkpoint(kit, tmp_path / "m", hf_config(kit))
    mistral_names = {k.replace("model.", "").replace("self_attn.q_proj", "attention.wq"): w for k, w in weights.items()}
    save_file(mistral_names, str(tmp_path / "m" / "consolidated.safetensors"))
    save_file(
        {"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 32)},
        str(tmp_path / "m" / "adapter_model.safetensors"),
    )
    m = load_model(tmp_path / "m")
    assert set(m.weights) == set(weights) and all(torch.equal(m.weights[k], w) for k, w in weights.items())


def test_qwen2_has_qkv_biases_and_tied_embeddings(kit, tmp_path):
    cfg = hf_config(kit, "qwen2", tie_word_embeddings=True, use_sliding_window=False, sliding_window=64)
    embed = torch.randn(cfg["vocab_size"], 32)
    weights = write_checkpoint(kit, tmp_path / "qwen", cfg, extra={"lm_head.weight": embed})
    m = load_model(tmp_path / "qwen", dtype=torch.bfloat16)
    assert m.config.attention_bias and m.config.tie_embeddings and m.config.max_position == 128
    assert "lm_head.weight" not in m.weights  # a stored copy of the tied head is dropped
    assert m.weights["model.layers.1.self_attn.k_proj.bias"].shape == (16,)
    assert all(t.dtype == torch.bfloat16 for t in m.weights.values())
    assert torch.equal(m.weights["model.layers.0.self_attn.q_proj.bias"], weights[
        "model.layers.0.self_attn.q_proj.bias"].to(torch.bfloat16))  # fmt: skip


def test_mistral_with_bf16_checkpoint_and_sliding_window(kit, tmp_path):
    cfg = hf_config(kit, "mistral", sliding_window=64, head_dim=None)
    weights = write_checkpoint(kit, tmp_path / "mistral", cfg, stored=torch.bfloat16)
    m = load_model(tmp_path / "mistral")
    assert m.config.arch == "mistral" and m.config.head_dim == 8
    assert m.config.max_position == 64  # exact only within the window, which the runtime does not implement
    w = m.weights["model.layers.0.mlp.up_proj.weight"]
    assert w.dtype == torch.float32 and torch.equal(w, weights["model.layers.0.mlp.up_proj.weight"].float())


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 8.0}}, "rope_scaling type 'dynamic' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias"),
    ],
)
def test_configs_the_runtime_cannot_run_exactly_are_rejected(kit, overrides, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf(hf_config(kit, **overrides))


def test_missing_or_misshapen_weights_are_reported(kit, tmp_path):
    cfg = hf_config(kit)
    write_checkpoint(kit, tmp_path / "m", cfg)
    cfg["intermediate_size"] = 48
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"mlp.down_proj.weight has shape \(32, 64\), expected \(32, 48\)"):
        load_model(tmp_path / "m")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(hf_config(kit)))
    write_tokenizer(kit, tmp_path / "empty", bos=False)
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors"):
        load_model(tmp_path / "empty")
