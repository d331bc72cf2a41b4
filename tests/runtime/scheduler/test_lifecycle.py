"""Abort, cancel and timeouts at any moment; refusal of requests that can never fit; fork shares the prefix's
blocks; namespaces never hit across; the schedules' orders and the starvation guard. Every path leaves the
cache's invariants true and no block held."""

from __future__ import annotations

import time

import pytest
import torch

from radixcache import CacheFullError
from radixcache.runtime import Engine
from radixcache.runtime.engine.request import Request
from radixcache.runtime.engine.schedule_order import admission_order
from radixcache.runtime.engine.scheduler import RequestTooLargeError, Scheduler, SchedulerConfig
from radixcache.runtime.testing import RandomModel

from .conftest import assert_clean, ids


def _order(s: Scheduler) -> tuple[dict[int, int], list]:
    """The scheduler's waiting requests in its admission order now."""
    return admission_order(s.waiting, s.prefilling, s.kv, s.config, time.perf_counter())


def step(engine: Engine, times: int = 1) -> None:
    with torch.inference_mode():
        for _ in range(times):
            engine.scheduler.step()


def test_abort_in_the_middle_of_prefill_frees_everything(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4, max_prefill_tokens=8)
    engine.generate(ids(20, 1), 2, ignore_eos=True)  # something cached, which the request hits and locks
    assert engine.wait_idle(30)  # the loop thread has left: it would step what the test adds by hand
    cached_before = engine.cache.cached_tokens
    req = engine._request(ids(20, 1) + ids(40, 2), 5, ignore_eos=True)
    engine.scheduler.add(req)
    step(engine, 2)
    assert req.kv.status.value == "running" and 20 <= req.kv.num_kv < 60 and req.kv.match_node is not None
    assert engine.cache.locked_blocks > 0
    computed = req.kv.num_kv
    assert engine.scheduler.abort(req)
    assert req.finish_reason == "cancelled" and not req.output_ids
    assert_clean(engine)
    # In-flight sharing: the pages its finished chunks committed stay cached (complete KV), nothing more.
    assert engine.cache.cached_tokens == computed // 4 * 4 > cached_before
    assert not engine.scheduler.abort(req), "aborting twice is harmless"


def test_abort_in_the_middle_of_decode_frees_everything(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    reqs = [engine._request(ids(10, 3 + i), 50, ignore_eos=True) for i in range(3)]
    for r in reqs:
        engine.scheduler.add(r)
    step(engine, 6)
    assert all(len(r.output_ids) >= 3 for r in reqs)
    engine.scheduler.abort(reqs[1])
    while engine.scheduler.has_work():
        step(engine)
    assert reqs[1].finish_reason == "cancelled" and len(reqs[1].output_ids) < 50
    assert [len(r.output_ids) for r in (reqs[0], reqs[2])] == [50, 50]
    assert_clean(engine)


def test_cancel_through_a_handle_returns_the_partial_output(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=256, page_size=4)
    handle = engine.submit(ids(10, 5), 400, ignore_eos=True)
    while len(handle.request.output_ids) < 3:
        time.sleep(0.001)
    handle.cancel()
    out = handle.result(timeout=10)
    assert out.finish_reason == "cancelled" and 3 <= len(out.token_ids) < 400
    assert_clean(engine)


def test_a_timeout_ends_the_request_and_frees_it(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=256, page_size=4)
    out, other = engine.generate([ids(10, 6), ids(12, 7)], 400, ignore_eos=True, timeout=0.05)
    assert out.finish_reason == other.finish_reason == "timeout"
    assert len(out.token_ids) < 400 and out.latency_s < 30
    assert_clean(engine)


def test_a_request_larger_than_the_pool_is_refused_at_once(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=4, page_size=16)
    with pytest.raises(RequestTooLargeError, match="whole KV pool"):
        engine.generate([ids(10, 8), ids(100, 9)], 3)
    # Refused, not queued to wait for pages that can never come (that would hang, and the run's timeout ends it),
    # and before its batch-mate is queued: the call is refused whole, as any other bad argument refuses it.
    assert (engine.stats.requests, engine.stats.prompt_tokens, engine.stats.generated_tokens) == (0, 0, 0)
    assert isinstance(RequestTooLargeError("x"), CacheFullError)  # what callers already catch
    assert_clean(engine)


def test_a_request_that_alone_outgrows_the_pool_ends_with_length_beside_others(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=6, page_size=8)
    big = engine.submit(ids(40, 10), 100, ignore_eos=True)  # needs 18 pages at its end
    small = engine.submit(ids(5, 11), 3, ignore_eos=True)
    out = big.result(timeout=30)
    assert out.finish_reason == "length" and 0 < len(out.token_ids) < 100
    assert len(out.token_ids) == 6 * 8 - 40 + 1  # every position the pool holds, plus the last sampled token
    assert len(small.result(timeout=30).token_ids) == 3
    assert_clean(engine)


def test_fork_computes_the_prefix_once_and_every_branch_locks_its_blocks(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    prefix = ids(30, 12)
    engine.generate(prefix, 1)
    assert engine.wait_idle(30)  # the loop thread has left: it would step what the test adds by hand
    branches = [engine._request([*prefix, 5 + i], 4, ignore_eos=True) for i in range(4)]
    for r in branches:
        engine.scheduler.add(r)
    step(engine)
    shared = {tuple(r.kv.block_table[:7]) for r in branches}
    assert len(shared) == 1, "the branches read the same 7 pages"
    node = branches[0].kv.match_node
    assert node is not None and node.end_len == 28 and all(r.kv.match_node is node for r in branches)
    assert node.lock_ref == 4
    while engine.scheduler.has_work():
        step(engine)
    assert node.lock_ref == 0
    assert_clean(engine)


def test_fork_runs_n_branches_from_one_prefix(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    prefix = "the same long prefix for all branches:"  # 38 characters: 38 tokens of the toy tokenizer
    outs = engine.fork(prefix, n=4, max_new_tokens=6, temperature=1.0, seed=3)
    assert len(outs) == 4 and len({o.token_ids for o in outs}) > 1, "different seeds, different branches"
    # Nothing was cached before the call: one branch's prefill of the prefix is not a hit for the others.
    assert all(o.cached_tokens == 0 and o.prefill_tokens == 38 for o in outs)
    # ... but it was computed once: 38 positions, then the last 2 (past the 9 shared pages) per other branch.
    assert engine.runner.prefill_positions == 38 + 3 * 2
    assert engine.stats.requests == 4, "no warm-up request"
    again = engine.fork(prefix, n=4, max_new_tokens=6, temperature=1.0, seed=3)
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]
    assert all(o.cached_tokens == 36 for o in again), "the prefix was cached before this call"
    cont = engine.fork(ids(20, 13), continuations=[[1], [2, 3]], max_new_tokens=2)
    assert [o.prompt_tokens for o in cont] == [21, 22]
    assert_clean(engine)


def test_namespaces_never_hit_across(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    p = ids(30, 14)
    a1 = engine.generate(p, 2, namespace="a")
    b1, c1 = engine.generate([p, p], 2, namespace="b")
    a2 = engine.generate(p, 2, namespace="a")
    assert a1.cached_tokens == 0 and a2.cached_tokens == 28
    assert b1.cached_tokens + c1.cached_tokens == 28, "within b, the second hits the first (in-batch sharing)"
    outs = engine.generate([p] * 3, 2, namespace="z")
    assert sum(o.cached_tokens for o in outs) == 2 * 28
    assert engine.generate(p, 2, namespace="fresh").cached_tokens == 0
    assert_clean(engine)


def test_in_batch_sharing_computes_a_common_uncached_prefix_once(tiny: RandomModel) -> None:
    shared = ids(40, 15)
    prompts = [shared + ids(6, 16 + i) for i in range(4)]
    lpm = Engine(tiny, capacity_blocks=128, page_size=4, schedule="lpm", max_prefill_tokens=512)
    fcfs = Engine(tiny, capacity_blocks=128, page_size=4, schedule="fcfs", max_prefill_tokens=512)
    reqs = {}
    with torch.inference_mode():
        for e in (lpm, fcfs):
            reqs[e] = [e._request(p, 2) for p in prompts]
            for r in reqs[e]:
                e.scheduler.add(r)
            e.scheduler.step()  # lpm: the first computes the shared pages, the others wait; fcfs: all four run
        assert len(fcfs.scheduler.running) == 4 and len(lpm.scheduler.running) == 1
        lpm.scheduler.step()  # the others are admitted now, on the pages committed by the first one's pass
    assert sorted(r.kv.cached_tokens for r in reqs[lpm]) == [0, 40, 40, 40]
    assert lpm.runner.prefill_positions == 46 + 3 * 6, "the shared 40 tokens were computed once"
    assert [r.kv.cached_tokens for r in reqs[fcfs]] == [0, 0, 0, 0], "fcfs is the plain baseline"


def test_lpm_admits_the_longest_cached_prefix_first_and_starvation_is_bounded(tiny: RandomModel) -> None:
    hot = ids(40, 20)
    for guard in (1000, 0):
        engine = Engine(
            tiny,
            capacity_blocks=256,
            page_size=4,
            scheduler_config=SchedulerConfig(schedule="lpm", max_prefill_tokens=10, max_wait_steps=guard),
        )
        engine.generate(hot, 1)
        assert engine.wait_idle(30)  # the loop thread has left: it would step what the test adds by hand
        cold = engine._request(ids(30, 21), 2)
        warm = engine._request([*hot, 1, 2], 2)
        engine.scheduler.add(cold)
        engine.scheduler.add(warm)
        _, order = _order(engine.scheduler)
        assert order == ([warm, cold] if guard else [cold, warm])
        while engine.scheduler.has_work():
            step(engine)
        assert_clean(engine)


def test_dfs_weight_groups_requests_by_shared_subtree(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=256, page_size=4, schedule="dfs-weight")
    a, b = ids(20, 30), ids(20, 31)
    engine.generate([a, b], 1)
    assert engine.wait_idle(30)  # the loop thread has left: it would step what the test adds by hand
    arrivals = [[*b, 1], [*a, 2], [*a, 3], [*b, 4], [*a, 5]]
    reqs = [engine._request(p, 1) for p in arrivals]
    for r in reqs:
        engine.scheduler.add(r)
    _, order = _order(engine.scheduler)
    assert [reqs.index(r) for r in order] == [1, 2, 4, 0, 3], "the heavier subtree (a: 3 requests) first"
    fcfs = Engine(tiny, capacity_blocks=256, page_size=4, schedule="fcfs")
    for r in [fcfs._request(p, 1) for p in arrivals]:
        fcfs.scheduler.add(r)
    assert [r.prompt_ids for r in _order(fcfs.scheduler)[1]] == arrivals


def test_pinned_prefix_survives_eviction_within_its_share(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=32, page_size=4, max_pinned_fraction=0.25)
    system = ids(32, 40)  # 8 pages: exactly the pinned share
    engine.generate([*system, 1], 1, pin=32)
    assert engine.stats.pinned_blocks == 8
    for i in range(6):
        engine.generate(ids(60, 41 + i), 2)  # floods the cache
    assert engine.generate([*system, 2], 1).cached_tokens == 32
    with pytest.raises(ValueError, match="pinned share"):
        engine.generate(ids(40, 50), 1, pin=True)
    assert_clean(engine)
    assert engine.unpin() == 1 and engine.stats.pinned_blocks == 0
    assert_clean(engine)


def test_retention_priority_keeps_a_prefix_through_eviction_that_lru_would_take(tiny: RandomModel) -> None:
    outcomes = []
    for retention in (0, 1):
        engine = Engine(tiny, capacity_blocks=32, page_size=4)
        system = ids(32, 60)
        engine.generate([*system, 1], 1, retention=retention)
        for i in range(6):
            engine.generate(ids(40, 61 + i), 2)  # newer than the system prompt: LRU alone evicts it first
        outcomes.append(engine.generate([*system, 2], 1).cached_tokens)
        assert_clean(engine)
        assert engine.cache.policy.name == "lru"
    assert outcomes == [0, 32]


def test_a_group_of_different_prompts_reports_what_each_found_cached(tiny: RandomModel) -> None:
    """The cap on a group's cached_tokens was what the tree held of the prompts' common prefix: prompts with none in
    common (or in different namespaces) reported 0 cached and every token prefilled, though each was cached whole."""
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    a, b = ids(20, 1), ids(20, 2)
    engine.generate(a, 2)
    engine.generate(b, 2, namespace="x")
    alone = [engine.generate(a, 2).cached_tokens, engine.generate(b, 2, namespace="x").cached_tokens]
    assert alone == [19, 19]
    group = [h.result(30) for h in engine.submit_group([a, b], 2, each=[{}, {"namespace": "x"}])]
    assert [r.cached_tokens for r in group] == alone and [r.prefill_tokens for r in group] == [1, 1]
    branches = engine.fork(a[:8], continuations=[a[8:], b[8:]], max_new_tokens=2)
    assert [r.cached_tokens for r in branches] == [19, 8]  # a whole; b's own tail was never cached
    fresh = engine.fork(ids(30, 3), 3, 2)  # nothing cached before the call: one branch's work is no hit
    assert [r.cached_tokens for r in fresh] == [0, 0, 0]
    assert_clean(engine)


def test_a_request_run_again_is_refused_instead_of_waiting_for_ever(tiny: RandomModel) -> None:
    """A Request leaves the scheduler once: `run` given one that had finished (a retry after an error, say a queue
    timeout) queued it, it ran again and never left, and `run` waited for ever. Refused now, before it is queued:
    one that finished, one still in flight, and one request twice in one batch."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    req = engine._request(ids(10, 60), 5, ignore_eos=True)
    first = engine.run(req)
    with pytest.raises(ValueError, match="runs once"):
        engine.run(req)
    pending = engine._request(ids(10, 61), 5, ignore_eos=True)
    handle = engine._enqueue([pending])[0]
    with pytest.raises(ValueError, match="runs once"):
        engine.run(pending)
    twice = engine._request(ids(10, 62), 5, ignore_eos=True)
    with pytest.raises(ValueError, match="runs once"):
        engine._enqueue([twice, twice])
    assert handle.result(30).token_ids == engine.generate(ids(10, 61), 5, ignore_eos=True).token_ids
    assert engine.generate(ids(10, 60), 5, ignore_eos=True).token_ids == first.token_ids
    assert engine.queue.waiting == 0
    assert_clean(engine)


def test_the_admission_order_is_linear_in_the_queue(tiny: RandomModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step orders the whole queue; the starved were taken out of it by a `not in` test against the list of
    the starved, quadratic: 3,000 queued requests past the guard cost 54 ms of each step, every decode waiting.
    Counted here in request comparisons (Request has identity equality: a list's `in` compares one by one)."""
    engine = Engine(tiny, capacity_blocks=256, page_size=4)
    reqs = [engine._request([1 + i % 90, 2, 3, 4, 5], 1) for i in range(400)]
    for r in reqs[::2]:
        r.wait_steps = 10**6  # past the starvation guard
    compared = []
    monkeypatch.setattr(Request, "__eq__", lambda a, b: compared.append(1) or a is b, raising=False)
    cached, order = admission_order(reqs, [], engine.scheduler.kv, engine.scheduler.config, time.perf_counter())
    monkeypatch.undo()
    assert len(compared) < len(reqs)
    starved = reqs[::2]  # first, in arrival order; then the rest, longest cached prefix first (nothing is cached)
    assert order == starved + sorted(reqs[1::2], key=lambda r: r.rid) and set(cached) == {r.rid for r in reqs[1::2]}
