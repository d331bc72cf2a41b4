"""Fixtures for the engine tests: tiny random Llama-family models (no files) and a toy tokenizer."""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.engine.mirror_twin import llama

TINY_VARIANTS = {
    "llama": {},
    "qwen2-bias": {"arch": "qwen2", "attention_bias": True},
    "tied-mha": {"tie_embeddings": True, "num_kv_heads": 4},
    "gqa4": {"num_heads": 8, "num_kv_heads": 2, "head_dim": 4},
}


@pytest.fixture(scope="session")
def tiny() -> RandomModel:
    """A 2-layer GQA model with a toy character tokenizer."""
    m = tiny_model(seed=7)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


@pytest.fixture(scope="session", params=sorted(TINY_VARIANTS))
def tiny_variant(request: pytest.FixtureRequest) -> RandomModel:
    return tiny_model(seed=11, **TINY_VARIANTS[request.param])


@pytest.fixture(scope="module")
def models() -> dict[torch.dtype, LlamaModel]:
    """The decode mirror tests' model (mirror_twin.MODEL) in float32 and float64 (test_quant_gguf.py has its own)."""
    return {dt: llama(dt) for dt in (torch.float32, torch.float64)}
