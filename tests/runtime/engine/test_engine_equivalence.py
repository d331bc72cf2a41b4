"""The heart of the runtime: with the cache on, outputs equal those with it off (same greedy tokens, logits
within 1e-4) on a tiny random model, at page sizes 1 and 16, for hits that end mid-page, with chunked prefill,
and with evictions between the turns of a multi-turn chat at a small capacity."""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime import Engine, GenerationResult
from radixcache.runtime.model.reference import reference_greedy
from radixcache.runtime.testing import RandomModel

TOL = 1e-4


def ids(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(1, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def pair(model: RandomModel, **kw: object) -> tuple[Engine, Engine]:
    return Engine(model, **kw), Engine(model, enable_cache=False, **kw)  # type: ignore[arg-type]


def assert_same(a: GenerationResult, b: GenerationResult) -> None:
    assert a.token_ids == b.token_ids
    assert a.finish_reason == b.finish_reason
    assert (a.logits - b.logits).abs().max().item() < TOL


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("chunk", [512, 5])
def test_shared_prefix_requests_give_the_same_tokens_and_logits(tiny: RandomModel, page: int, chunk: int) -> None:
    on, off = pair(tiny, capacity_blocks=2048 // page, page_size=page, prefill_chunk=chunk)
    system = ids(37, 97, seed=1)  # 37: hits end mid-page at page 16 (2 whole pages = 32 tokens reused)
    for i in range(4):
        prompt = system + ids(3 + 5 * i, 97, seed=10 + i)
        a = on.generate(prompt, 6, return_logits=True, ignore_eos=True)
        b = off.generate(prompt, 6, return_logits=True, ignore_eos=True)
        assert_same(a, b)
        assert b.cached_tokens == 0
        if i:
            assert a.cached_tokens == (37 // page) * page  # whole pages only: the rest is recomputed
            assert a.prefill_tokens == len(prompt) - a.cached_tokens
        on.cache.check_invariants()
    assert list(a.token_ids) == reference_greedy(tiny.config, tiny.weights, prompt, 6)


@pytest.mark.parametrize("page", [1, 16])
def test_repeating_a_prompt_reuses_all_but_its_last_token(tiny: RandomModel, page: int) -> None:
    on, off = pair(tiny, capacity_blocks=512, page_size=page)
    prompt = ids(48, 97, seed=2)  # 48 = 3 pages of 16: the last token's page is cached, and copied to be written
    first = on.generate(prompt, 4, return_logits=True, ignore_eos=True)
    again = on.generate(prompt, 4, return_logits=True, ignore_eos=True)
    base = off.generate(prompt, 4, return_logits=True, ignore_eos=True)
    assert first.cached_tokens == 0
    assert again.cached_tokens == 47 and again.prefill_tokens == 1  # only the last token is computed again
    assert_same(first, base)
    assert_same(again, base)
    on.cache.check_invariants()
    third = on.generate(prompt, 4, return_logits=True, ignore_eos=True)  # the tree's page is intact after the copy
    assert third.cached_tokens == 47
    assert_same(third, base)
    assert on.cache.free_blocks + on.cache.evictable_blocks == on.cache.capacity_blocks  # the copies went back


@pytest.mark.parametrize("page", [1, 16])
def test_continuing_from_generated_tokens_hits_the_output_pages(tiny: RandomModel, page: int) -> None:
    on, off = pair(tiny, capacity_blocks=512, page_size=page)
    prompt = ids(20, 97, seed=3)
    first = on.generate(prompt, 30, ignore_eos=True)
    follow = [*prompt, *first.token_ids, *ids(5, 97, seed=4)]
    a = on.generate(follow, 5, return_logits=True, ignore_eos=True)
    b = off.generate(follow, 5, return_logits=True, ignore_eos=True)
    # The last generated token's K/V was never computed, so the tree holds prompt + output[:-1].
    assert a.cached_tokens == ((len(prompt) + 30 - 1) // page) * page
    assert_same(a, b)


@pytest.mark.parametrize("page", [1, 16])
def test_multi_turn_chat_with_evictions_between_turns(tiny: RandomModel, page: int) -> None:
    capacity = 640 // page  # small: each turn's distractor request evicts part of the conversation
    on, off = pair(tiny, capacity_blocks=capacity, page_size=page)
    msgs_on: list[dict[str, str]] = [{"role": "system", "content": "you are a tiny random model."}]
    msgs_off = list(msgs_on)
    hits: list[int] = []
    evicted_conversation = False
    big = Engine(tiny, capacity_blocks=4096 // page, page_size=page)
    for turn in range(4):
        user = {"role": "user", "content": f"turn {turn}: tell me something about the number {turn * 7}?"}
        a = on.chat([*msgs_on, user], 12, return_logits=True, ignore_eos=True)
        b = off.chat([*msgs_off, user], 12, return_logits=True, ignore_eos=True)
        assert_same(a, b)
        assert a.text == b.text
        hits.append(a.cached_tokens)
        roomy = big.chat([*msgs_on, user], 12, return_logits=True, ignore_eos=True)  # never evicts
        assert_same(a, roomy)
        evicted_conversation |= a.cached_tokens < roomy.cached_tokens
        msgs_on += [user, {"role": "assistant", "content": a.text}]
        msgs_off += [user, {"role": "assistant", "content": b.text}]
        distractor = ids(420, 97, seed=100 + turn)  # evicts the conversation in part
        assert_same(
            on.generate(distractor, 3, return_logits=True, ignore_eos=True),
            off.generate(distractor, 3, return_logits=True, ignore_eos=True),
        )
        on.cache.check_invariants()
        assert on.cache.locked_blocks == 0
    assert on.cache.stats.evicted_blocks > 0, "the test must evict between turns"
    assert all(h > 0 for h in hits[1:]), "later turns should still reuse what survived eviction"
    assert evicted_conversation, "some turn must find part of the conversation evicted"


@pytest.mark.parametrize("page", [1, 16])
def test_eviction_of_a_hit_prefix_under_pressure_keeps_outputs(tiny: RandomModel, page: int) -> None:
    """Capacity just above one request: every new request evicts the previous one's pages."""
    prompt_len = 60
    capacity = -(-(prompt_len + 8) // page) + 1
    on, off = pair(tiny, capacity_blocks=capacity, page_size=page)
    base = ids(prompt_len - 8, 97, seed=5)
    for i in range(4):
        prompt = base + ids(8, 97, seed=50 + i) if i % 2 else ids(prompt_len, 97, seed=60 + i)
        assert_same(
            on.generate(prompt, 6, return_logits=True, ignore_eos=True),
            off.generate(prompt, 6, return_logits=True, ignore_eos=True),
        )
        on.cache.check_invariants()
    assert on.cache.stats.evicted_blocks > 0


def test_seeded_sampling_is_the_same_with_and_without_the_cache(tiny: RandomModel) -> None:
    on, off = pair(tiny, capacity_blocks=64, page_size=16)
    prompt = ids(40, 97, seed=6)
    on.generate(prompt, 2)  # warm the cache
    kw = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 1234, "ignore_eos": True}
    a = on.generate(prompt, 10, **kw)
    b = off.generate(prompt, 10, **kw)
    assert a.cached_tokens == 32
    assert a.token_ids == b.token_ids
