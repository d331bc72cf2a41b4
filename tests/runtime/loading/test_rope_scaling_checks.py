"""Scaled RoPE fields read and checked: config.json's `rope_scaling` / `rope_parameters` and a GGUF file's
`rope_freqs.weight` and `rope.scaling.*` metadata become a RopeScaling, and what cannot be run exactly (dynamic NTK,
other kinds) or is out of range is a ValueError naming the file and the key. The frequencies themselves are
compared with transformers in test_rope_scaling.py; here, rope_tables against hand-computed llama3 values."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from radixcache.runtime.config import RopeScaling
from radixcache.runtime.loading import load_model
from radixcache.runtime.loading.hf import config_from_hf
from radixcache.runtime.model.rope import rope_tables
from radixcache.runtime.testing import tiny_config
from tests.runtime.loading.gguf_files import write_model_gguf
from tests.runtime.loading.test_gguf_model import random_weights
from tests.runtime.loading.test_gguf_model import tiny_config as gguf_tiny_config

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}  # fmt: skip


def hf(**overrides) -> dict:
    cfg = {
        "model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
    }  # fmt: skip
    cfg.update(overrides)
    return cfg


def test_llama31_config_gives_its_scaling_and_unscaled_configs_none():
    c = config_from_hf(hf(rope_scaling=LLAMA3))
    assert c.rope_scaling == RopeScaling("llama3", 8.0, 8192, 1.0, 4.0)
    assert c.rope_theta == 500000.0 and c.max_position == 131072
    assert config_from_hf(hf()).rope_scaling is None
    assert config_from_hf(hf(rope_scaling=None)).rope_scaling is None
    assert config_from_hf(hf(rope_scaling={"rope_type": "default"})).rope_scaling is None
    assert config_from_hf(hf(rope_scaling={"type": "linear", "factor": 2})).rope_scaling == RopeScaling("linear", 2.0)


def test_transformers5_rope_parameters_carry_theta_and_scaling():
    c = config_from_hf(hf(rope_theta=None, rope_parameters={**LLAMA3, "rope_theta": 1e6}))
    assert c.rope_theta == 1e6 and c.rope_scaling is not None and c.rope_scaling.kind == "llama3"
    plain = config_from_hf(hf(rope_theta=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    assert plain.rope_theta == 1e6 and plain.rope_scaling is None  # not silently 10000


def test_qwen25_yarn_gets_transformers_defaults_and_mscale():
    c = config_from_hf(hf(model_type="qwen2", rope_scaling={"type": "yarn", "factor": 4.0,
                                                            "original_max_position_embeddings": 32768}))  # fmt: skip
    s = c.rope_scaling
    assert s is not None and (s.kind, s.factor, s.original_max_position, s.beta_fast, s.beta_slow) == (
        "yarn",
        4.0,
        32768,
        32.0,
        1.0,
    )
    assert s.attention_factor == pytest.approx(0.1 * math.log(4.0) + 1)
    implicit = config_from_hf(hf(rope_scaling={"rope_type": "yarn", "original_max_position_embeddings": 32768}))
    assert implicit.rope_scaling is not None and implicit.rope_scaling.factor == 4.0  # 131072 / 32768


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"rope_type": "dynamic", "factor": 2.0}, "rope_scaling type 'dynamic' is not supported (dynamic NTK"),
        ({"type": "longrope", "factor": 2.0}, "rope_scaling type 'longrope' is not supported (supported: linear"),
        ({"rope_type": "linear"}, "rope_scaling.factor is missing"),
        ({"rope_type": "linear", "factor": 0}, "rope_scaling.factor is 0, expected a finite number above 0"),
        ({"rope_type": "linear", "factor": float("nan")}, "rope_scaling.factor is nan"),
        ({"rope_type": "linear", "factor": "2"}, "rope_scaling.factor is '2'"),
        ({**LLAMA3, "low_freq_factor": 4.0}, "rope_scaling.low_freq_factor 4.0 must be below high_freq_factor 4.0"),
        ({**LLAMA3, "high_freq_factor": None}, "rope_scaling.high_freq_factor is missing"),
        ({**LLAMA3, "original_max_position_embeddings": 0}, "rope_scaling.original_max_position_embeddings is 0"),
        ({**LLAMA3, "original_max_position_embeddings": 8.5}, "original_max_position_embeddings is 8.5, not an"),
        ({"rope_type": "yarn", "factor": 4.0, "beta_fast": 1.0, "beta_slow": 2.0}, "rope_scaling.beta_slow 2.0"),
        ({"rope_type": "yarn", "factor": 4.0, "attention_factor": -1}, "rope_scaling.attention_factor is -1"),
        ({"rope_type": "yarn", "factor": 4.0, "truncate": "no"}, "rope_scaling.truncate must be true or false"),
        ({**LLAMA3, "partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 (partial RoPE) is not supported"),
        ("linear", "rope_scaling 'linear' is not supported"),
    ],
)
def test_bad_or_unsupported_scaling_is_a_value_error_naming_the_file_and_key(scaling, message):
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        config_from_hf(hf(rope_scaling=scaling), where="m/config.json")
    assert str(caught.value).startswith("m/config.json: ")


def test_conflicting_theta_or_nested_rope_parameters_are_refused():
    with pytest.raises(
        ValueError, match=re.escape("rope_theta 500000.0 and rope_parameters.rope_theta 10000.0 differ")
    ):
        config_from_hf(hf(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    with pytest.raises(ValueError, match=r"rope_parameters .* is not supported"):
        config_from_hf(hf(rope_parameters={"full_attention": {"rope_type": "default"}}))


def test_rope_tables_apply_llama3_band_by_band():
    """Hand-checked against Meta's `apply_scaling`: short waves kept, long ones divided by factor, one blended."""
    scaling = RopeScaling("llama3", factor=8.0, original_max_position=64, low_freq_factor=1.0, high_freq_factor=4.0)
    config = tiny_config(head_dim=8, rope_scaling=scaling)  # wavelengths 6.3, 62.8, 628, 6283
    cos, sin = rope_tables(config, torch.device("cpu"), torch.float64)
    base = [10000.0 ** (-i / 4) for i in range(4)]
    smooth = (64 / (2 * math.pi / base[1]) - 1) / 3
    expected = [base[0], (1 - smooth) * base[1] / 8 + smooth * base[1], base[2] / 8, base[3] / 8]
    pos = 100
    angles = torch.atan2(sin[pos, :4], cos[pos, :4])
    want = torch.tensor([(pos * f + math.pi) % (2 * math.pi) - math.pi for f in expected], dtype=torch.float64)
    assert torch.allclose(angles, want, atol=1e-9)
    assert torch.equal(cos[:, :4], cos[:, 4:])
    plain_cos, _ = rope_tables(tiny_config(head_dim=8), torch.device("cpu"), torch.float64)
    assert torch.equal(cos[:, 0], plain_cos[:, 0]) and not torch.equal(cos[:, 3], plain_cos[:, 3])


def test_yarn_attention_factor_multiplies_cos_and_sin():
    scaling = RopeScaling("yarn", factor=4.0, original_max_position=64, attention_factor=1.25)
    cos, sin = rope_tables(tiny_config(rope_scaling=scaling), torch.device("cpu"), torch.float64)
    assert torch.allclose(cos**2 + sin**2, torch.full_like(cos, 1.25**2))


# ---------------------------------------------------------------------- GGUF


def write(kit, path, meta=None, freqs=None) -> None:
    cfg = gguf_tiny_config(kit, tie=False)  # head_dim 16: rope_freqs holds 8 factors
    meta = {"llama.attention.key_length": 16, **(meta or {})}
    tensors = None if freqs is None else {"rope_freqs.weight": freqs}
    tokenizer = kit.tiny_tokenizer_metadata(typed=False)
    write_model_gguf(path, cfg, random_weights(cfg), lambda name, w: "F32", tokenizer, meta, tensors)


FACTORS = np.array([1, 1, 1.5, 3, 8, 8, 8, 8], dtype=np.float32)


def test_gguf_rope_freqs_and_scaling_metadata_are_read(kit, tmp_path):
    write(kit, tmp_path / "freqs.gguf", freqs=FACTORS)
    m = load_model(tmp_path / "freqs.gguf")
    assert m.config.rope_scaling == RopeScaling("default", freq_factors=tuple(FACTORS.tolist()))
    assert "rope_freqs.weight" not in m.weights
    write(kit, tmp_path / "lin.gguf", meta={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0})
    assert load_model(tmp_path / "lin.gguf").config.rope_scaling == RopeScaling("linear", 2.0)
    write(kit, tmp_path / "one.gguf", meta={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 1.0})
    assert load_model(tmp_path / "one.gguf").config.rope_scaling is None
    yarn = {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
            "llama.rope.scaling.original_context_length": 64, "llama.rope.scaling.yarn_beta_fast": 16.0}  # fmt: skip
    write(kit, tmp_path / "yarn.gguf", meta=yarn, freqs=FACTORS)  # both: llama.cpp applies both
    s = load_model(tmp_path / "yarn.gguf").config.rope_scaling
    assert s is not None and (s.kind, s.factor, s.original_max_position, s.beta_fast, s.beta_slow) == (
        "yarn",
        4.0,
        64,
        16.0,
        1.0,
    )
    assert s.freq_factors == tuple(FACTORS.tolist()) and s.attention_factor == pytest.approx(1 + 0.1 * math.log(4))


def test_gguf_freq_factors_divide_the_frequencies_before_the_scaling():
    """llama.cpp's rope_yarn: theta_extrap = pos * base / freq_factor, then linear scaling on top."""
    both = RopeScaling("linear", factor=2.0, freq_factors=tuple(FACTORS.tolist()))
    config = tiny_config(head_dim=16, rope_scaling=both)
    cos, _ = rope_tables(config, torch.device("cpu"), torch.float64)
    plain, _ = rope_tables(tiny_config(head_dim=16), torch.device("cpu"), torch.float64)
    # frequency 0 has factor 1 (then /2): position p here is position p/2 unscaled; frequency 4 has 8*2 = 16.
    assert torch.allclose(cos[torch.arange(0, 512, 16), 4], plain[torch.arange(32), 4], atol=1e-12)
    assert torch.allclose(cos[torch.arange(0, 512, 2), 0], plain[torch.arange(256), 0], atol=1e-12)


@pytest.mark.parametrize(
    ("freqs", "meta", "message"),
    [
        (FACTORS[:4], None, "tensor rope_freqs.weight is F32 of shape (4,), expected F32 of shape (8,)"),
        (FACTORS.astype(np.float16), None, "tensor rope_freqs.weight is F16 of shape (8,)"),
        (np.where(np.arange(8) == 3, np.nan, FACTORS).astype(np.float32), None, "rope_freqs.weight holds nan"),
        (np.where(np.arange(8) == 3, 0, FACTORS).astype(np.float32), None, "rope_freqs.weight holds 0.0"),
        (np.where(np.arange(8) == 3, -2, FACTORS).astype(np.float32), None, "rope_freqs.weight holds -2.0"),
        (None, {"llama.rope.scaling.type": "longrope"}, "llama.rope.scaling.type 'longrope' is not supported"),
        (None, {"llama.rope.scaling.alpha": 1000.0}, "llama.rope.scaling.alpha is not supported"),
        (None, {"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 2.0}, "is ambiguous"),
        (None, {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 0.0}, "scaling.factor is 0.0"),
        (None, {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
                "llama.rope.scaling.original_context_length": 0}, "original_context_length is 0"),
        (None, {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
                "llama.rope.scaling.yarn_ext_factor": 0.5}, "yarn_ext_factor 0.5 is not supported"),
        # arrays where numbers or text belong: "The truth value of an array ... is ambiguous", naming nothing
        (None, {"llama.rope.scaling.type": [1, 2]}, "llama.rope.scaling.type is array([1, 2], dtype=int32), not text"),
        (None, {"llama.rope.scaling.type": ["yarn"]}, "llama.rope.scaling.type is ['yarn'], not text"),
        (None, {"llama.rope.scaling.attn_factor": [1.0, 2.0]}, "llama.rope.scaling.attn_factor is an array"),
        (None, {"llama.rope.scaling.alpha": [1.0, 2.0]}, "llama.rope.scaling.alpha is an array"),
        (None, {"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
                "llama.rope.scaling.yarn_log_multiplier": [0.1, 0.2]}, "yarn_log_multiplier is an array"),
    ],
)  # fmt: skip
def test_bad_gguf_scaling_is_a_value_error_naming_the_file(kit, tmp_path, freqs, meta, message):
    write(kit, tmp_path / "bad.gguf", meta=meta, freqs=freqs)
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        load_model(tmp_path / "bad.gguf")
    assert str(caught.value).startswith(f"{tmp_path / 'bad.gguf'}: ")
