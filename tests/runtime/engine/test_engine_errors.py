"""Errors anywhere in a request's life leave the cache consistent: no block leaked, no lock left, the tree intact,
and the engine still answers exactly as a fresh one."""

from __future__ import annotations

import pytest
import torch

from radixcache import CacheFullError
from radixcache.runtime import Engine
from radixcache.runtime.testing import RandomModel


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_clean(engine: Engine) -> None:
    c = engine.cache
    c.check_invariants()
    assert c.locked_blocks == 0 and c.held_blocks == 0
    assert c.free_blocks + c.evictable_blocks == c.capacity_blocks


class Boom(RuntimeError):
    pass


def test_prompt_larger_than_the_cache_raises_cache_full_and_holds_nothing(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=4, page_size=16)
    engine.generate(ids(40, 1), 3)  # something cached, to be kept
    before = engine.cache.evictable_blocks
    with pytest.raises(CacheFullError):
        engine.generate(ids(100, 2), 3)
    assert_clean(engine)
    assert engine.cache.evictable_blocks == before


def test_running_out_of_pages_during_decode_ends_with_length_and_keeps_the_tokens(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=3, page_size=16)
    out = engine.generate(ids(40, 3), 20, ignore_eos=True)  # a 4th page would be needed at token 48
    assert out.finish_reason == "length"
    assert len(out.token_ids) == 48 - 40 + 1  # positions 40..47 computed, plus the token sampled from the last
    full = Engine(tiny, capacity_blocks=8, page_size=16).generate(ids(40, 3), 20, ignore_eos=True)
    assert out.token_ids == full.token_ids[: len(out.token_ids)]  # the same tokens a larger pool gives
    assert_clean(engine)
    assert engine.generate(ids(40, 3), 5, ignore_eos=True).finish_reason == "length"


def test_prompt_past_max_position_is_refused_before_touching_the_cache(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=16)
    with pytest.raises(ValueError, match="max_position"):
        engine.generate(ids(tiny.config.max_position, 4), 2)
    assert engine.cache.stats.queries == 0
    assert_clean(engine)


def test_generation_stops_at_max_position(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=16)
    out = engine.generate(ids(tiny.config.max_position - 3, 5), 10, ignore_eos=True)
    assert len(out.token_ids) == 3 and out.finish_reason == "length"
    assert_clean(engine)


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("where", ["prefill", "decode"])
@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_a_failing_forward_unlocks_and_frees_and_keeps_the_tree(
    tiny: RandomModel, monkeypatch: pytest.MonkeyPatch, page: int, where: str, exc: type[BaseException]
) -> None:
    engine = Engine(tiny, capacity_blocks=512 // page, page_size=page)
    fresh = Engine(tiny, capacity_blocks=512 // page, page_size=page)
    shared = ids(40, 6)
    engine.generate(shared + ids(5, 7), 4, ignore_eos=True)
    cached_before = engine.cache.cached_tokens
    real = engine.model.forward
    calls = {"n": 0}

    def failing(pool: object, *, decode: object = None, chunks: object = ()) -> object:
        part = chunks if where == "prefill" else decode
        if part:
            calls["n"] += 1
            if calls["n"] >= 3 or where == "prefill":  # from then on: the pass's retry alone fails too
                raise exc("injected")
        return real(pool, decode=decode, chunks=chunks)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.model, "forward", failing)
    with pytest.raises(exc):
        engine.generate(shared + ids(30, 8), 8, ignore_eos=True)  # a hit: its match node is locked
    assert_clean(engine)
    if where == "prefill":
        assert engine.cache.cached_tokens == cached_before  # the failed pass committed nothing
    else:  # the passes that returned committed their full pages (in-flight sharing): the whole prompt's
        assert engine.cache.peek(shared + ids(30, 8)).length == 70 // page * page
    monkeypatch.setattr(engine.model, "forward", real)
    prompt = shared + ids(30, 8)
    a = engine.generate(prompt, 8, return_logits=True, ignore_eos=True)
    b = fresh.generate(prompt, 8, return_logits=True, ignore_eos=True)
    assert a.cached_tokens == ((40 if where == "prefill" else 69) // page) * page  # 69: all but the last token
    assert a.token_ids == b.token_ids
    assert (a.logits - b.logits).abs().max().item() < 1e-4
    assert_clean(engine)


def test_bad_inputs_are_refused_up_front(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=16, page_size=16)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([], 2)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([1, 2, 500], 2)
    with pytest.raises(ValueError):
        engine.generate([1, 2], 0)
    bare = Engine(RandomModel(tiny.config, tiny.weights), capacity_blocks=16)
    with pytest.raises(ValueError, match="tokenizer"):
        bare.generate("text needs a tokenizer", 2)
    assert_clean(engine)
