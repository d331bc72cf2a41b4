"""Scaled RoPE through the engine: the paged model (rope_tables, the native decode that consumes them) equals the
plain reference model (its own frequencies, runtime.model.reference._frequencies) for llama3, linear and YaRN scaling
and llama.cpp's per-frequency factors, prefill over a cached prefix and greedy decode from the Engine alike; and the
disk tier's fingerprint tells apart two models that differ only in their scaling."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.config import RopeScaling
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.kv.tier.fingerprint import kv_fingerprint
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.model.reference import reference_greedy, reference_logits
from radixcache.runtime.testing import RandomModel, tiny_model

TOL = 1e-4
FACTORS = (1.0, 1.0, 2.5, 8.0)  # head_dim 8: four frequencies
SCALINGS = {
    "llama3": RopeScaling("llama3", factor=8.0, original_max_position=16, low_freq_factor=1.0, high_freq_factor=4.0),
    "linear": RopeScaling("linear", factor=3.0),
    "yarn": RopeScaling("yarn", factor=4.0, original_max_position=16, attention_factor=1.1386),
    "yarn-untruncated": RopeScaling("yarn", factor=4.0, original_max_position=16, beta_fast=8.0, truncate=False),
    "freqs": RopeScaling("default", freq_factors=FACTORS),
    "freqs+linear": RopeScaling("linear", factor=2.0, freq_factors=FACTORS),
}


@pytest.fixture(scope="module", params=sorted(SCALINGS))
def scaled(request: pytest.FixtureRequest) -> RandomModel:
    return tiny_model(seed=5, rope_scaling=SCALINGS[request.param])


def ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_scaling_changes_the_reference_past_the_original_length(scaled: RandomModel) -> None:
    prompt = ids(60, scaled.config.vocab_size)
    plain = dataclasses.replace(scaled.config, rope_scaling=None)
    diff = reference_logits(scaled.config, scaled.weights, prompt) - reference_logits(plain, scaled.weights, prompt)
    assert diff[20:].abs().max().item() > 1e-2


@pytest.mark.parametrize("split", [0, 23])
def test_paged_prefill_over_a_prefix_equals_the_reference(scaled: RandomModel, split: int) -> None:
    cfg = scaled.config
    prompt = ids(60, cfg.vocab_size, seed=split)
    expected = reference_logits(cfg, scaled.weights, prompt, dtype=torch.float64)
    model = LlamaModel(cfg, scaled.weights)
    pool = model.new_pool(32, 4)
    table = list(range(15))
    parts = [model.prefill(prompt[:split], 0, table, pool, all_logits=True)] if split else []
    parts.append(model.prefill(prompt[split:], split, table, pool, all_logits=True))
    assert (torch.cat(parts) - expected).abs().max().item() < TOL


@pytest.mark.slow
def test_engine_greedy_decode_equals_the_reference_and_reuses_the_prefix(scaled: RandomModel) -> None:
    cfg = scaled.config
    prompt = ids(40, cfg.vocab_size, seed=3)
    with Engine(scaled, capacity_blocks=64, page_size=4) as engine:
        first = engine.generate(prompt, 12, ignore_eos=True)
        again = engine.generate([*prompt, 1, 2, 3], 12, ignore_eos=True)
    assert list(first.token_ids) == reference_greedy(cfg, scaled.weights, prompt, 12)
    assert again.cached_tokens >= 40 - 4
    assert list(again.token_ids) == reference_greedy(cfg, scaled.weights, [*prompt, 1, 2, 3], 12)


def test_fingerprint_differs_when_only_the_scaling_differs() -> None:
    plain = tiny_model(seed=1).config
    pool = KVPool(plain, 4, 4)
    prints = {
        name: kv_fingerprint(dataclasses.replace(plain, rope_scaling=s), pool, weights="w", quant="none")
        for name, s in [("plain", None), *SCALINGS.items()]
    }
    assert len(set(prints.values())) == len(prints)
    assert kv_fingerprint(plain, pool, weights="w", quant="none") == prints["plain"]
    same = dataclasses.replace(plain, rope_scaling=RopeScaling("linear", factor=3.0))
    assert kv_fingerprint(same, pool, weights="w", quant="none") == prints["linear"]
    other = dataclasses.replace(plain, rope_scaling=RopeScaling("linear", factor=3.5))
    assert kv_fingerprint(other, pool, weights="w", quant="none") != prints["linear"]
