"""LlamaModel refuses weights whose shapes the config does not imply: the native kernels take their sizes from the
config, so a smaller weight was read past its end (a final norm of half the hidden size decoded garbage, no error)."""

from __future__ import annotations

import dataclasses
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
