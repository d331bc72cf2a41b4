"""The real model (SmolLM2-135M-Instruct, GGUF Q4_1 dequantised to float32): it answers, its paged logits equal
the plain reference forward, and the cache changes nothing in its outputs (on quant="gguf": the same weights, the
file's blocks for decode). Skipped only where the model package is not installed (CI installs it); the model is
loaded once per run (tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.model.reference import reference_logits

pytestmark = pytest.mark.slow
TOL = 1e-4
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smol(smollm2: Any) -> Any:
    return smollm2  # loaded once per run (tests/conftest.py)


@pytest.fixture(scope="module")
def model(smollm2_fp32: Any) -> LlamaModel:
    return smollm2_fp32  # built once per worker (tests/conftest.py): the engines below share it


@pytest.fixture(scope="module")
def gguf_model(smollm2_gguf_model: Any) -> LlamaModel:
    """The same weights with quant="gguf" (tests/conftest.py, built once per worker), for the test of the cache: it
    holds on either path."""
    return smollm2_gguf_model


def engine(model: LlamaModel, smol: Any, **kw: Any) -> Engine:
    return Engine(model, tokenizer=smol.tokenizer, **kw)


def test_answers_the_capital_of_france(smol: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The public path, by name, as the README shows it: the engine loads "smollm2" (with load_model's defaults, the
    call that loaded the session's `smol`: that load is given back, not repeated; the name itself is resolved in
    tests/runtime/loading/test_resolve.py and loaded by the server tests' process) and builds its model."""
    from radixcache.runtime import loading

    calls = []

    def load_model(spec: Any, **kw: Any) -> Any:
        calls.append((spec, kw))
        return smol

    monkeypatch.setattr(loading, "load_model", load_model)
    engine = Engine("smollm2", kv_memory="64MiB")
    assert calls == [("smollm2", {"dtype": torch.float32, "device": "cpu", "keep_blocks": False})]
    assert engine.tokenizer is smol.tokenizer and isinstance(engine.model, LlamaModel)
    out = engine.chat(FRANCE, max_new_tokens=10)
    assert "Paris" in out.text, out.text
    assert out.finish_reason == "stop" and out.token_ids[-1] in smol.tokenizer.eos_token_ids
    assert engine.cache.locked_blocks == 0 and engine.cache.evictable_blocks > 0


def test_paged_logits_equal_the_reference_forward(model: LlamaModel, smol: Any) -> None:
    ids = smol.tokenizer.encode(smol.tokenizer.apply_chat_template(FRANCE, add_generation_prompt=True))
    expected = reference_logits(smol.config, smol.weights, ids, dtype=torch.float64)
    pool = model.new_pool(8, 16)
    table = [5, 2, 7]
    split = 21  # a cached prefix that ends mid-page, then the rest, then one decode step
    got = torch.cat(
        [
            model.prefill(ids[:split], 0, table, pool, all_logits=True),
            model.prefill(ids[split:-1], split, table, pool, all_logits=True),
        ]
    )
    from radixcache.runtime.model.attention import build_decode_meta

    last = model.decode(ids[-1:], build_decode_meta([table], [len(ids)], 16, model.device), pool)
    got = torch.cat([got, last])
    diff = (got - expected).abs().max().item()
    assert diff < TOL, f"max abs logit difference {diff:.3g}"


@pytest.mark.parametrize("page", [1, 16])
def test_cache_on_equals_cache_off_across_turns_with_eviction(gguf_model: LlamaModel, smol: Any, page: int) -> None:
    capacity = 128 // page  # under two conversations: the distractor evicts part of the first turn
    on = engine(gguf_model, smol, capacity_blocks=capacity, page_size=page)
    off = engine(gguf_model, smol, capacity_blocks=capacity, page_size=page, enable_cache=False)
    msgs = [{"role": "user", "content": "Name a colour."}]
    distractor = [{"role": "user", "content": "List three animals that live in the sea, and say where. " * 6}]
    hits = []
    for _turn in range(2):
        a = on.chat(msgs, 5, return_logits=True)
        b = off.chat(msgs, 5, return_logits=True)
        assert a.token_ids == b.token_ids
        assert (a.logits - b.logits).abs().max().item() < TOL
        hits.append(a.cached_tokens)
        msgs = [*msgs, {"role": "assistant", "content": a.text}, {"role": "user", "content": "And another?"}]
        d_on, d_off = on.chat(distractor, 1, return_logits=True), off.chat(distractor, 1, return_logits=True)
        assert d_on.token_ids == d_off.token_ids
        assert (d_on.logits - d_off.logits).abs().max().item() < TOL
        on.cache.check_invariants()
        assert on.cache.locked_blocks == 0
    assert hits[1] > 0, "the second turn reuses the system prompt and first turn"
    assert on.cache.stats.evicted_blocks > 0
