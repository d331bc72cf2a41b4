"""Continuous batching changes nothing in the outputs: 16 interleaved multi-turn sessions, a pool so small that
requests are preempted and recomputed, and every schedule give the tokens of the same requests run alone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.testing import RandomModel, hold_engine_loop

from .conftest import assert_clean, ids

TOL = 1e-4
SYSTEMS = [ids(24, 100 + g) for g in range(4)]  # four shared system prompts, four sessions each


def user_turn(session: int, turn: int) -> list[int]:
    return ids(5 + (session + turn) % 4, 1000 * session + turn)


async def run_sessions(
    engine: Engine, turns: int, max_new: int, on_first_turns: Callable[[], object] | None = None
) -> dict[tuple[int, int], object]:
    """16 sessions as concurrent tasks; each sends its turns in order, appending the reply to its history.
    `on_first_turns` is called once every session has submitted its first turn."""
    out: dict[tuple[int, int], object] = {}

    async def session(i: int) -> None:
        history = list(SYSTEMS[i % 4])
        for k in range(turns):
            history += user_turn(i, k)
            res = await engine.agenerate(history, max_new, ignore_eos=True, return_logits=True)
            out[i, k] = res
            history += list(res.token_ids)
            await asyncio.sleep(0)

    tasks = [asyncio.ensure_future(session(i)) for i in range(16)]
    if on_first_turns is not None:  # the loop is held: the first turns wait in the queue until it is released
        # agenerate builds its request on a worker thread, so a task's first await does not mean it is queued
        deadline = time.monotonic() + 30
        while engine.queue.waiting < len(tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        on_first_turns()
    await asyncio.gather(*tasks)
    return out


def run_alone(engine: Engine, turns: int, max_new: int) -> dict[tuple[int, int], object]:
    out: dict[tuple[int, int], object] = {}
    for i in range(16):
        history = list(SYSTEMS[i % 4])
        for k in range(turns):
            history += user_turn(i, k)
            res = engine.generate(history, max_new, ignore_eos=True, return_logits=True)
            out[i, k] = res
            history += list(res.token_ids)
    return out


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].token_ids == want[key].token_ids, key
        assert (got[key].logits - want[key].logits).abs().max().item() < TOL, key


@pytest.fixture(scope="module")
def alone(tiny: RandomModel) -> dict:
    return run_alone(Engine(tiny, capacity_blocks=512, page_size=4, enable_cache=False), 3, 6)


@pytest.mark.parametrize("schedule", ["lpm", "fcfs", "dfs-weight"])
def test_sixteen_interleaved_sessions_equal_the_requests_run_alone(
    tiny: RandomModel, alone: dict, schedule: str
) -> None:
    engine = Engine(tiny, capacity_blocks=512, page_size=4, schedule=schedule, max_prefill_tokens=64)
    got = asyncio.run(run_sessions(engine, 3, 6, on_first_turns=hold_engine_loop(engine)))
    assert_same(got, alone)
    assert_clean(engine)
    s = engine.stats
    assert s.requests == 48 and s.cached_tokens > 0 and s.preemptions == 0
    assert s.steps < 48 * 7, "requests were batched, not run one after another"


def test_a_pool_too_small_forces_preemption_and_changes_nothing(tiny: RandomModel, alone: dict) -> None:
    engine = Engine(tiny, capacity_blocks=30, page_size=4, max_prefill_tokens=48)
    got = asyncio.run(run_sessions(engine, 3, 6, on_first_turns=hold_engine_loop(engine)))
    assert_same(got, alone)
    assert engine.stats.preemptions > 0 and engine.cache.stats.evicted_blocks > 0
    assert_clean(engine)


def test_preempted_requests_are_recomputed_and_counted_apart(tiny: RandomModel) -> None:
    prompts = [ids(20, 300 + i) for i in range(8)]
    want = [Engine(tiny, capacity_blocks=256, page_size=4).generate(p, 30, ignore_eos=True) for p in prompts]
    engine = Engine(tiny, capacity_blocks=40, page_size=4)  # 8 requests need ~100 pages at their ends
    got = engine.generate(prompts, 30, ignore_eos=True)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    s = engine.stats
    assert s.preemptions > 0 and sum(g.preemptions for g in got) == s.preemptions
    assert s.recomputed_tokens == sum(g.recomputed_tokens for g in got)
    assert all(g.cached_tokens == 0 for g in got), "recomputation is not a cache hit"
    assert s.cached_tokens == 0 and s.hit_rate == 0.0
    assert_clean(engine)


def test_low_priority_requests_are_preempted_first(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=30, page_size=4)
    prompts = [ids(20, 400 + i) for i in range(6)]
    handles = [engine.submit(p, 30, ignore_eos=True, priority=5 if i == 0 else 0) for i, p in enumerate(prompts)]
    results = [h.result() for h in handles]
    assert results[0].preemptions == 0
    assert sum(r.preemptions for r in results[1:]) > 0
    assert_clean(engine)


def test_batched_decode_equals_single_decode_over_different_lengths(tiny: RandomModel) -> None:
    prompts = [ids(3 + 7 * i, 500 + i) for i in range(8)]
    alone_engine = Engine(tiny, capacity_blocks=256, page_size=16)
    want = [alone_engine.generate(p, 12, ignore_eos=True, return_logits=True) for p in prompts]
    engine = Engine(tiny, capacity_blocks=256, page_size=16)
    got = engine.generate(prompts, 12, ignore_eos=True, return_logits=True)
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        assert (g.logits - w.logits).abs().max().item() < TOL
    assert engine.stats.steps <= 8 + 12 + 2


def test_seeded_sampling_is_the_same_under_batching(tiny: RandomModel) -> None:
    prompts = [ids(10, 600 + i) for i in range(5)]
    alone_engine = Engine(tiny, capacity_blocks=128, page_size=4)
    want = [alone_engine.generate(p, 10, temperature=0.9, seed=i).token_ids for i, p in enumerate(prompts)]
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    handles = [engine.submit(p, 10, temperature=0.9, seed=i) for i, p in enumerate(prompts)]
    assert [h.result().token_ids for h in handles] == want
