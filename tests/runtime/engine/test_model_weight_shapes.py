"""LlamaModel refuses weights whose shapes the config does not imply: the native kernels take their sizes from the
config, so a smaller weight was read past its end (a final norm of half the hidden size decoded garbage, no error)."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import torch

from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.testing import tiny_model


@pytest.mark.parametrize(
    ("name", "tensor", "message"),
    [
        ("model.norm.weight", torch.ones(16), "'model.norm.weight' has shape (16,), expected (32,)"),
        ("model.layers.0.input_layernorm.weight", torch.ones(64), "input_layernorm.weight' has shape (64,)"),
        ("model.layers.1.self_attn.q_proj.weight", torch.ones(16, 32), "q_proj.weight' has shape (16, 32)"),
        ("model.layers.0.mlp.down_proj.weight", torch.ones(32, 48), "down_proj.weight' has shape (32, 48)"),
        ("lm_head.weight", torch.ones(50, 32), "'lm_head.weight' has shape (50, 32), expected (97, 32)"),
        ("model.layers.0.self_attn.q_proj.bias", torch.ones(8), "q_proj.bias' has shape (8,), expected (32,)"),
    ],
)
def test_a_weight_of_the_wrong_shape_is_refused(name, tensor, message):
    model = tiny_model(seed=1)
    weights = {**model.weights, name: tensor}
    if name.endswith(".bias"):  # biases are taken when present (or the config says so): all three then
        for p in "kv":
            weights[name.replace("q_proj", f"{p}_proj")] = torch.zeros(16)
    with pytest.raises(ValueError, match=re.escape(message)):
        LlamaModel(model.config, weights)


def test_zero_kv_heads_is_a_value_error_not_a_division_by_zero():
    model = tiny_model(seed=1)
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads 0"):
        LlamaModel(dataclasses.replace(model.config, num_kv_heads=0), model.weights)


def _mem_total() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        return int(next(x for x in f if x.startswith("MemTotal:")).split()[1]) * 1024


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="needs Linux's /proc")
def test_a_context_length_whose_rope_tables_pass_the_memory_is_refused_by_name() -> None:
    """The RoPE tables are built for the whole context: a GGUF file's context_length of 2**32 asked for a terabyte
    (the process was killed, or failed on a bare allocation error). Now a ValueError naming max_position before any
    allocation; a long real context (2**20 positions) still builds."""
    past = _mem_total() // (tiny_model().config.head_dim * 8 * 4) + 1
    m = tiny_model(seed=1, max_position=past)
    with pytest.raises(ValueError, match=f"max_position {past} .* more than the"):
        LlamaModel(m.config, m.weights)
    m = tiny_model(seed=1, max_position=2**20)
    assert LlamaModel(m.config, m.weights).cos.shape[0] == 2**20
