"""Hostile lease values are clear errors naming the field, before anything is queued; the budget is validated
with the engine's options; a mixed workload of leases, hits, cancels and preemptions keeps the tree's invariants
after every step, greedy outputs equal to a no-cache engine's, and leaves nothing locked after the deadlines."""

from __future__ import annotations

import math
import random

import pytest

from radixcache.runtime.engine.engine_config import EngineConfig
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.kv.leases import MAX_RETAIN_FOR_S, check_retain_for
from tests.runtime.leases.conftest import prompt

HOSTILE = [-1, -0.5, math.nan, math.inf, -math.inf, MAX_RETAIN_FOR_S + 1, 1e300, True, False, "30", [30], object()]


def _stable_id(value: object) -> str:
    # repr(object()) holds an address: xdist's workers would collect different ids and refuse to run.
    return "object()" if type(value) is object else repr(value)


@pytest.mark.parametrize("value", HOSTILE, ids=_stable_id)
def test_a_hostile_retain_for_is_a_value_error_naming_it(value, make_engine):
    with pytest.raises(ValueError, match="retain_for"):
        RequestOptions(retain_for=value)
    engine = make_engine()
    with pytest.raises(ValueError, match="retain_for"):
        engine.generate(prompt(0, 8), 2, retain_for=value)
    assert engine.check()["locked_blocks"] == 0 and engine.stats.requests == 0


def test_good_values_are_seconds():
    assert check_retain_for(None) is None
    assert check_retain_for(0) == 0.0 and check_retain_for(30) == 30.0 and check_retain_for(2.5) == 2.5
    assert RequestOptions(retain_for=7).retain_for == 7.0
    assert RequestOptions.of(4, retain_for=MAX_RETAIN_FOR_S).retain_for == MAX_RETAIN_FOR_S


@pytest.mark.parametrize("value", [-0.1, 1.5, math.nan, True, "0.5", None])
def test_a_hostile_lease_fraction_is_refused_before_the_model_loads(value):
    with pytest.raises(ValueError, match="lease_fraction"):
        EngineConfig(model="no-such-model", lease_fraction=value)


def test_a_lease_clock_must_be_callable():
    with pytest.raises(ValueError, match="lease_clock"):
        EngineConfig(model="no-such-model", lease_clock=5)


def test_mixed_traffic_keeps_invariants_every_step_and_outputs_equal_no_cache(make_engine, clock):
    engine = make_engine(capacity_blocks=30, lease_fraction=0.6)
    cold = make_engine(enable_cache=False, capacity_blocks=200)
    rng = random.Random(3)
    contexts = {a: prompt(a, rng.randint(8, 20)) for a in range(6)}
    for _round in range(4):
        handles = []
        for agent, ctx in contexts.items():
            hint = rng.choice([None, 0, 1.5, 4.0, 9.0])
            handles.append((agent, engine.submit(ctx, rng.randint(1, 6), retain_for=hint, ignore_eos=True)))
        victim = handles[rng.randrange(len(handles))][1]
        victim.cancel()
        for agent, handle in handles:
            r = handle.result()
            if r.finish_reason == "cancelled":
                assert r.lease is None or not r.lease.granted
                continue
            expect = cold.generate(contexts[agent], len(r.token_ids), ignore_eos=True)
            assert r.token_ids == expect.token_ids
            tail = prompt(agent + 10 * _round, rng.randint(1, 8))
            contexts[agent] = [*contexts[agent], *r.token_ids, *tail][:200]
        clock.advance(rng.uniform(0.5, 4.0))
        g = engine.check()
        assert g["leased_blocks"] <= engine.kv.leases.max_blocks
    clock.advance(10)
    g = engine.check()
    assert (g["leases"], g["locked_blocks"], g["held_blocks"]) == (0, 0, 0)
