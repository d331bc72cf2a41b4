"""Scaled RoPE (Llama 3.1's llama3, linear, YaRN) loaded from Hugging Face directories and GGUF files, compared with
transformers' own LlamaForCausalLM: a tiny random model saved by `save_pretrained`, loaded by our loader, its logits
over a prompt well past the original context (64 tokens here) and its greedy tokens from the Engine must equal
transformers' to float32 tolerance. The GGUF file carries the llama3 scaling the way llama.cpp's converter writes
it: a `rope_freqs.weight` tensor of per-frequency divisors, computed here from the converter's formula."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.loading import load_model
from tests.runtime.loading.gguf_files import write_model_gguf

transformers = pytest.importorskip("transformers")

ORIGINAL = 64  # the "pretraining" context: the prompt runs well past it
PROMPT = 150
SCALINGS = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL, "beta_fast": 32.0,
             "beta_slow": 1.0},
    "yarn-type-key": {"type": "yarn", "factor": 3.0, "original_max_position_embeddings": ORIGINAL},
}  # fmt: skip


def hf_model(vocab: int, scaling: dict | None, arch: str = "llama", seed: int = 0):
    """A tiny transformers model: 16-dim heads (8 frequencies, wavelengths 6 to 4,000 positions: each llama3 and
    YaRN band holds some), theta 10000."""
    torch.manual_seed(seed)
    kw = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, rope_scaling=scaling,
    )  # fmt: skip
    if arch == "qwen2":
        config = transformers.Qwen2Config(**kw, use_sliding_window=False)
        model = transformers.Qwen2ForCausalLM(config)
    elif arch == "mistral":
        config = transformers.MistralConfig(**kw, sliding_window=None)
        model = transformers.MistralForCausalLM(config)
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw))
    with torch.no_grad():  # spread the logits: transformers' 0.02 init makes every token nearly tied
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / p.shape[1] ** 0.5)
    return model.float().eval()


def save(model, kit, directory, old_format: bool = False) -> None:
    """`save_pretrained`, whose transformers 5 writes `rope_parameters` (rope_theta inside); `old_format` rewrites
    config.json as the Hub's Llama 3.1 and Qwen2.5 files are: `rope_theta` and `rope_scaling` at the top."""
    from tests.runtime.loading.test_hf import write_tokenizer

    model.save_pretrained(directory)
    write_tokenizer(kit, directory, bos=False)
    if old_format:
        path = directory / "config.json"
        cfg = json.loads(path.read_text())
        params = cfg.pop("rope_parameters")
        cfg["rope_theta"] = params.pop("rope_theta")
        if "type" in params:  # transformers adds rope_type beside an older file's `type`: keep the file's alone
            del params["rope_type"]
        cfg["rope_scaling"] = params
        path.write_text(json.dumps(cfg))


def prompt_ids(vocab: int, n: int = PROMPT) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(1)).tolist()


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(ids) :].tolist()


def engine_logits_and_tokens(loaded, ids: list[int], n: int) -> tuple[torch.Tensor, list[int]]:
    with Engine(loaded, capacity_blocks=128, page_size=4) as engine:
        result = engine.generate(ids, n, ignore_eos=True, return_logits=True)
        return torch.stack([torch.as_tensor(x) for x in result.logits]), list(result.token_ids)


def assert_matches_transformers(loaded, model, vocab: int) -> None:
    from radixcache.runtime.model.llama import LlamaModel

    ids = prompt_ids(vocab)
    expected = hf_logits(model, ids)
    ours = LlamaModel(loaded.config, loaded.weights)
    pool = ours.new_pool(64, 4)
    got = ours.prefill(ids, 0, list(range(-(-PROMPT // 4))), pool, all_logits=True)
    assert (got - expected).abs().max().item() < 2e-4
    greedy = hf_greedy(model, ids, 6)
    logits, tokens = engine_logits_and_tokens(loaded, ids, 6)
    assert tokens == greedy
    assert (logits[0] - expected[-1]).abs().max().item() < 2e-4


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "old_format"),
    [("llama3", False), ("llama3", True), ("linear", True), ("yarn", False), ("yarn-type-key", True)],
)
def test_hf_scaled_llama_equals_transformers(kit, tmp_path, kind: str, old_format: bool) -> None:
    vocab = len(kit.tiny_vocab()[0])
    model = hf_model(vocab, SCALINGS[kind])
    save(model, kit, tmp_path / kind, old_format)
    written = json.loads((tmp_path / kind / "config.json").read_text())
    assert ("rope_scaling" in written) == old_format and ("rope_parameters" in written) != old_format
    loaded = load_model(tmp_path / kind)
    assert loaded.config.rope_scaling is not None
    assert loaded.config.rope_scaling.kind == SCALINGS[kind].get("rope_type", SCALINGS[kind].get("type"))
    assert_matches_transformers(loaded, model, vocab)
    unscaled = hf_model(vocab, None)  # the scaling matters here: plain RoPE gives other logits past ORIGINAL
    unscaled.load_state_dict(model.state_dict())
    ids = prompt_ids(vocab)
    assert (hf_logits(unscaled, ids)[ORIGINAL:] - hf_logits(model, ids)[ORIGINAL:]).abs().max().item() > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_hf_scaled_qwen2_and_mistral_equal_transformers(kit, tmp_path, arch: str) -> None:
    vocab = len(kit.tiny_vocab()[0])
    model = hf_model(vocab, SCALINGS["yarn" if arch == "qwen2" else "llama3"], arch)
    save(model, kit, tmp_path / arch)
    loaded = load_model(tmp_path / arch)
    assert loaded.config.arch == arch and loaded.config.rope_scaling is not None
    assert_matches_transformers(loaded, model, vocab)


def llama3_freq_factors(scaling: dict, theta: float, head_dim: int) -> list[float]:
    """llama.cpp's convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors): each frequency's divisor."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def write_gguf_of(model, kit, path, extra_meta=None, freq_factors=None) -> None:
    from radixcache.runtime.loading.hf import config_from_hf

    hf = model.config.to_dict()
    hf.pop("rope_parameters", None)  # the GGUF carries the scaling its own way
    hf.pop("rope_scaling", None)
    config = config_from_hf({**hf, "rope_theta": 10000.0})
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    write_model_gguf(
        path, config, weights, lambda name, w: "F32", kit.tiny_tokenizer_metadata(typed=False),
        extra_meta=extra_meta, extra_tensors={"rope_freqs.weight": freq_factors} if freq_factors is not None else None,
    )  # fmt: skip


@pytest.mark.slow
def test_gguf_rope_freqs_equals_transformers_llama3(kit, tmp_path) -> None:
    vocab = len(kit.tiny_vocab()[0])
    model = hf_model(vocab, SCALINGS["llama3"])
    factors = np.array(llama3_freq_factors(SCALINGS["llama3"], 10000.0, 16), dtype=np.float32)
    assert factors.min() == 1.0 and factors.max() == 8.0 and len(set(factors.tolist())) > 2  # all three bands
    write_gguf_of(model, kit, tmp_path / "m.gguf", freq_factors=factors)
    loaded = load_model(str(tmp_path / "m.gguf"))
    assert loaded.config.rope_scaling is not None and loaded.config.rope_scaling.freq_factors == tuple(factors)
    assert "rope_freqs.weight" not in loaded.weights
    assert_matches_transformers(loaded, model, vocab)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "arch"), [("linear", "llama"), ("yarn", "llama"), ("yarn", "qwen2")])
def test_gguf_scaling_metadata_equals_transformers(kit, tmp_path, kind: str, arch: str) -> None:
    """The keys llama.cpp's converter writes for a linear or YaRN config.json (Qwen2.5's long-context setting)."""
    vocab = len(kit.tiny_vocab()[0])
    model = hf_model(vocab, SCALINGS[kind], arch)
    meta = {f"{arch}.rope.scaling.type": kind, f"{arch}.rope.scaling.factor": 4.0}
    if kind == "yarn":
        meta[f"{arch}.rope.scaling.original_context_length"] = ORIGINAL
    write_gguf_of(model, kit, tmp_path / "m.gguf", extra_meta=meta)
    loaded = load_model(str(tmp_path / "m.gguf"))
    assert loaded.config.rope_scaling is not None and loaded.config.rope_scaling.kind == kind
    assert loaded.config.arch == arch
    assert_matches_transformers(loaded, model, vocab)


@pytest.mark.parametrize(
    ("scaling", "model_type"),
    [
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}, "llama"),  # Llama 3.1 8B
        ({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}, "llama"),  # Llama 3.2 1B / 3B
        ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, "qwen2"),  # Qwen2.5
        ({"rope_type": "linear", "factor": 2.0}, "llama"),
    ],
)  # fmt: skip
def test_frequencies_of_real_configs_equal_transformers(scaling: dict, model_type: str) -> None:
    """The real models' numbers (head_dim 128, theta 500000 or 1e6, long original contexts), frequency by
    frequency: rope_tables' and the reference model's against transformers' ROPE_INIT_FUNCTIONS."""
    from radixcache.runtime.loading.hf import config_from_hf
    from radixcache.runtime.model.reference import _frequencies
    from radixcache.runtime.model.rope import scaled_frequencies

    theta = 1e6 if model_type == "qwen2" else 500000.0
    kw = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=theta,
              max_position_embeddings=131072, rope_scaling=scaling)  # fmt: skip
    hf_config = (transformers.Qwen2Config if model_type == "qwen2" else transformers.LlamaConfig)(**kw)
    rope_type = scaling.get("rope_type", scaling.get("type"))
    want, attention = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
    ours = config_from_hf({"model_type": model_type, "vocab_size": 10, "intermediate_size": 8,
                           "num_hidden_layers": 1, **kw})  # fmt: skip
    assert ours.rope_scaling is not None and ours.rope_scaling.attention_factor == pytest.approx(attention)
    plain = 1.0 / (theta ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    got = scaled_frequencies(plain, ours.rope_scaling, theta, 128)
    torch.testing.assert_close(got, want.double(), rtol=2e-6, atol=0)
    torch.testing.assert_close(torch.tensor(_frequencies(ours)[0], dtype=torch.float64), got, rtol=1e-12, atol=0)
