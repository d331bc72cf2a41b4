"""The Engine's public surface: construction, results, stats, chat, stops, dtypes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixcache.runtime import Engine, GenerationResult
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.testing import CharTokenizer, RandomModel


def test_result_reports_tokens_cache_use_and_timing(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    prompt = "the quick brown fox jumps over the lazy dog."
    first = engine.generate(prompt, 5, ignore_eos=True)
    second = engine.generate(prompt + " again", 5, ignore_eos=True)
    assert isinstance(first, GenerationResult)
    assert first.prompt_tokens == len(prompt) and first.cached_tokens == 0 and first.prefill_tokens == len(prompt)
    assert second.cached_tokens == (len(prompt) // 4) * 4
    assert second.cached_tokens + second.prefill_tokens == second.prompt_tokens
    assert len(first.token_ids) == 5 and first.finish_reason == "length"
    assert 0 < first.ttft_s <= first.latency_s
    assert first.logits is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.text = "x"  # type: ignore[misc]


def test_stats_count_hits_and_block_states(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    for _ in range(3):
        engine.generate(list(range(1, 30)), 3, ignore_eos=True)
    s = engine.stats
    assert s.requests == 3 and s.prompt_tokens == 87 and s.generated_tokens == 9
    assert s.cached_tokens == 2 * 28 and s.prefill_tokens == 87 - 56
    assert s.hit_rate == pytest.approx(56 / 87)
    assert s.free_blocks + s.evictable_blocks + s.locked_blocks == s.capacity_blocks == 64
    assert s.locked_blocks == 0 and s.evictable_blocks > 0
    assert s.cache.queries == 3


def test_cache_off_reuses_nothing_and_keeps_the_tree_empty(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4, enable_cache=False)
    for _ in range(2):
        out = engine.generate(list(range(1, 30)), 3, ignore_eos=True)
        assert out.cached_tokens == 0
    assert engine.cache.free_blocks == 64 and engine.stats.hit_rate == 0.0


def test_eos_stops_and_is_kept_in_ids_but_not_in_text(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    probe = engine.generate("hello there", 6, ignore_eos=True)
    stop_id = probe.token_ids[2]
    out = engine.generate("hello there", 6, stop_token_ids=[stop_id])
    assert out.finish_reason == "stop"
    assert out.token_ids == probe.token_ids[: probe.token_ids.index(stop_id) + 1]
    assert out.text == tiny.tokenizer.decode(list(out.token_ids[:-1]))


def test_stop_string_cuts_the_text(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    probe = engine.generate("hello there", 12, ignore_eos=True)
    assert len(probe.text) >= 4
    stop = probe.text[2:4]
    out = engine.generate("hello there", 12, stop=stop, ignore_eos=True)
    assert out.finish_reason == "stop"
    assert out.text == probe.text[: probe.text.index(stop)]
    assert engine.cache.locked_blocks == 0


def test_chat_renders_the_template(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    msgs = [{"role": "user", "content": "hi"}]
    a = engine.chat(msgs, 4, ignore_eos=True)
    b = engine.generate(tiny.tokenizer.apply_chat_template(msgs, add_generation_prompt=True), 4, ignore_eos=True)
    assert a.token_ids == b.token_ids


def test_kv_memory_sizes_the_pool(tiny: RandomModel) -> None:
    engine = Engine(tiny, kv_memory="256KiB", page_size=16)
    per_block = tiny.config.kv_bytes_per_token(4) * 16
    assert engine.cache.capacity_blocks == 256 * 1024 // per_block
    assert engine.pool.num_blocks == engine.cache.capacity_blocks
    assert engine.pool.nbytes <= 256 * 1024


def test_engine_takes_a_built_model_and_a_tokenizer(tiny: RandomModel) -> None:
    model = LlamaModel(tiny.config, tiny.weights)
    a = Engine(model, tokenizer=CharTokenizer(97), capacity_blocks=32, page_size=8)
    b = Engine(tiny, capacity_blocks=32, page_size=8, policy="lfu")
    assert a.generate("abc", 4, ignore_eos=True).token_ids == b.generate("abc", 4, ignore_eos=True).token_ids


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_and_mostly_agrees_with_float32(tiny: RandomModel, dtype: str) -> None:
    ref = Engine(tiny, capacity_blocks=32, page_size=8).generate("abcdef", 4, return_logits=True, ignore_eos=True)
    engine = Engine(tiny, capacity_blocks=32, page_size=8, dtype=dtype)
    assert engine.pool.kv.dtype == getattr(torch, dtype)
    out = engine.generate("abcdef", 4, return_logits=True, ignore_eos=True)
    assert out.token_ids[0] == ref.token_ids[0]
    assert torch.isfinite(out.logits).all()


def test_unknown_dtype_is_refused(tiny: RandomModel) -> None:
    with pytest.raises(ValueError, match="dtype"):
        Engine(tiny, capacity_blocks=8, dtype="int8")


def test_a_missing_model_says_so() -> None:
    from radixcache.runtime.loading import ModelNotFoundError

    with pytest.raises(ModelNotFoundError):
        Engine("/nonexistent/model.gguf")
