"""In-flight sharing and batched prefill, in the orders real traffic produces: a request that arrives while
another is prefilling or decoding the same prefix matches every page computed so far; decoded pages reach the
tree as they fill; several requests' chunks share one pass; outputs equal the requests run alone."""

from __future__ import annotations

import threading

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.engine.scheduler import SchedulerConfig
from radixcache.runtime.testing import RandomModel

from .conftest import assert_clean, ids

P = 4  # page size of these tests


def step(engine: Engine, times: int = 1) -> None:
    with torch.inference_mode():
        for _ in range(times):
            engine.scheduler.step()


def run_all(engine: Engine) -> None:
    while engine.scheduler.has_work():
        step(engine)
    engine.scheduler.drain()


def cached_pages(engine: Engine, tokens: list[int]) -> int:
    return engine.cache.peek(tokens).length


def test_each_prefill_chunk_is_in_the_tree_as_soon_as_its_pass_returns(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=P, max_prefill_tokens=10)
    a = engine._request(ids(40, 1), 3, ignore_eos=True)
    engine.scheduler.add(a)
    for done in (10, 20, 30):
        step(engine)
        assert a.kv.num_kv == done
        assert cached_pages(engine, a.prompt_ids) == done // P * P, "the chunk's full pages are committed"
        assert a.kv.tree_blocks == done // P and a.kv.match_node is not None and a.kv.match_node.lock_ref >= 1
        engine.cache.check_invariants()
    run_all(engine)
    assert_clean(engine)


def test_a_request_arriving_mid_prefill_matches_the_pages_computed_so_far(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=P, max_prefill_tokens=8)
    system = ids(32, 2)
    a = engine._request([*system, *ids(8, 3)], 4, ignore_eos=True)
    engine.scheduler.add(a)
    step(engine, 2)  # a has computed 16 of its 40 tokens
    b = engine._request([*system, *ids(6, 4)], 4, ignore_eos=True)
    engine.scheduler.add(b)
    run_all(engine)
    assert b.kv.cached_tokens == 32, "b waited for a's remaining system pages, then matched all of them"
    # The system prompt was computed once: a's 40 positions, then b's own 6.
    assert engine.runner.prefill_positions == 40 + 6
    assert_clean(engine)


def test_a_request_arriving_while_another_decodes_hits_its_prompt(tiny: RandomModel) -> None:
    for share in (True, False):
        cfg = SchedulerConfig(share_in_flight=share)
        engine = Engine(tiny, capacity_blocks=64, page_size=P, scheduler_config=cfg)
        system = ids(30, 5)
        a = engine._request([*system, 9], 30, ignore_eos=True)
        engine.scheduler.add(a)
        step(engine, 3)  # prefilled, now decoding
        assert a.output_ids and a in engine.scheduler.decoding
        b = engine._request([*system, 11, 12], 3, ignore_eos=True)
        engine.scheduler.add(b)
        step(engine)
        assert b.kv.cached_tokens == (28 if share else 0), "before in-flight sharing, a decoding request shared nothing"
        run_all(engine)
        assert_clean(engine)


def test_decoded_pages_reach_the_tree_as_they_fill(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=P)
    a = engine._request(ids(6, 6), 14, ignore_eos=True)
    engine.scheduler.add(a)
    while a in engine.scheduler.running or a in engine.scheduler.waiting:
        step(engine)
        if a.kv.status.value == "running":
            assert cached_pages(engine, a.all_ids) == a.kv.num_kv // P * P
            engine.cache.check_invariants()
    # A later request that continues a's whole text hits everything but the unaligned tail.
    b = engine.generate([*a.all_ids, 3], 1)
    assert b.cached_tokens == (len(a.all_ids) - 1) // P * P, "every computed page (the last token's K/V never is)"
    assert_clean(engine)


def test_prefill_chunks_of_several_requests_share_one_pass(tiny: RandomModel) -> None:
    prompts = [ids(12 + i, 30 + i) for i in range(5)]
    alone = Engine(tiny, capacity_blocks=128, page_size=P, enable_cache=False)
    want = [alone.generate(p, 6, ignore_eos=True, return_logits=True) for p in prompts]
    for seqs in (1, 5):
        cfg = SchedulerConfig(max_prefill_seqs=seqs, max_prefill_tokens=512)
        engine = Engine(tiny, capacity_blocks=128, page_size=P, scheduler_config=cfg)
        reqs = [engine._request(p, 6, ignore_eos=True, return_logits=True) for p in prompts]
        for r in reqs:
            engine.scheduler.add(r)
        step(engine)
        assert sum(r.kv.num_kv > 0 for r in reqs) == seqs, "max_prefill_seqs requests prefilled in the first pass"
        assert engine.runner.passes == 1
        run_all(engine)
        for r, w in zip(reqs, want, strict=True):
            assert tuple(r.output_ids) == w.token_ids
            assert (torch.stack(r.logits) - w.logits).abs().max().item() < 1e-4
        assert_clean(engine)


def test_a_long_prompt_beside_decodes_gets_the_mixed_budget_per_pass(tiny: RandomModel) -> None:
    cfg = SchedulerConfig(max_prefill_tokens=512, mixed_prefill_tokens=8)
    engine = Engine(tiny, capacity_blocks=128, page_size=P, scheduler_config=cfg)
    running = [engine._request(ids(5, 40 + i), 20, ignore_eos=True) for i in range(2)]
    for r in running:
        engine.scheduler.add(r)
    step(engine, 2)
    long = engine._request(ids(100, 50), 2, ignore_eos=True)
    engine.scheduler.add(long)
    before = long.kv.num_kv
    step(engine)
    assert long.kv.num_kv - before == 8, "while others decode, a pass computes at most mixed_prefill_tokens"
    assert all(len(r.output_ids) == 3 for r in running), "and every running request still got its token"
    run_all(engine)
    assert_clean(engine)


@pytest.mark.parametrize("share", [True, False])
def test_api_calls_arriving_while_the_first_decodes_all_hit_the_system_prompt(tiny: RandomModel, share: bool) -> None:
    """The acceptance burst through the Python API, in a fixed order: the first request's listener holds the loop
    thread right after its first token until the other three are queued, so they certainly arrive while it decodes
    (39 more tokens to go). Without in-flight sharing they would recompute the system prompt."""
    cfg = SchedulerConfig(max_prefill_tokens=64, share_in_flight=share)
    engine = Engine(tiny, capacity_blocks=512, page_size=16, scheduler_config=cfg)
    system = ids(400, 7)  # the tiny model's max_position is 512
    decoding, gate = threading.Event(), threading.Event()

    def hold_after_first_token(r: object) -> None:  # on the engine loop thread
        if len(r.output_ids) == 1:  # type: ignore[attr-defined]
            decoding.set()
            gate.wait(60)

    first = engine.submit([*system, *ids(20, 8)], 40, ignore_eos=True)
    first.request.listener = hold_after_first_token
    assert decoding.wait(60)
    later = [engine.submit([*system, *ids(20, 9 + i)], 8, ignore_eos=True) for i in range(3)]
    gate.set()
    results = [h.result(60) for h in [first, *later]]
    assert results[0].cached_tokens == 0 and len(results[0].token_ids) == 40
    if share:
        assert [r.cached_tokens for r in results[1:]] == [400] * 3
    else:  # the first arrival recomputes the prompt the decoding request holds (later ones may hit its copy)
        assert results[1].cached_tokens == 0
    assert engine.wait_idle(30)
    assert_clean(engine)


@pytest.mark.parametrize("share", [True, False])
def test_a_request_waits_for_a_sharers_pages_only_if_they_will_be_committed(tiny: RandomModel, share: bool) -> None:
    """With share_in_flight=False a prompt reaches the tree only when its request leaves: a request arriving while
    another prefills the same prefix gains nothing by waiting, so it is admitted at once and prefills beside it."""
    cfg = SchedulerConfig(prefill_chunk=8, share_in_flight=share)  # a takes 8 tokens a step, leaving budget for b
    engine = Engine(tiny, capacity_blocks=64, page_size=P, scheduler_config=cfg)
    prefix = ids(64, 1)
    a = engine._request([*prefix, 5], 4, ignore_eos=True)
    b = engine._request([*prefix, 6], 4, ignore_eos=True)
    engine.scheduler.add(a)
    step(engine)
    engine.scheduler.add(b)
    step(engine)
    assert (b.t_admitted is None) is share  # in flight: it waits for a's pages; without: nothing to wait for
    run_all(engine)
    assert b.kv.cached_tokens == (64 if share else 0)
    alone = Engine(tiny, capacity_blocks=64, page_size=P, enable_cache=False)
    assert tuple(b.output_ids) == alone.generate(b.prompt_ids, 4, ignore_eos=True).token_ids
    assert_clean(engine)
