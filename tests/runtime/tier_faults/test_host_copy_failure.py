"""A device-to-host copy that raises never leaves the host tier pointing at bytes it does not hold: the page hash
is mapped to its slot only once the copy succeeded, so a later prompt is served KV that equals recomputation (its
tokens equal a no-cache engine's); a copy that raises during a device eviction (write_back) leaves the tree's and
the host tier's counters right, so the engine's invariant check (what /health/cache runs) keeps passing.

The copy failure is injected into the engine's own HostKVPool (the one torch copy of the host tier); the model is
the tiny random one in float64, where any KV mismatch changes the greedy tokens.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

MAX_NEW = 8
PAGE = 4


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=11)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def _prompts(vocab: int, n: int) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(vocab) for _ in range(40)] for _ in range(n)]


def _engine(model: RandomModel, policy: str, **kw: object) -> Engine:
    host = 400 * PAGE * model.config.kv_bytes_per_token(8)
    return Engine(
        model,
        capacity_blocks=40,  # about three prompts: each new one demotes an older one
        page_size=PAGE,
        host_kv_memory=host,
        write_policy=policy,
        load_back="always",
        dtype="float64",
        **kw,
    )


def _failing_saves(engine: Engine, fail: Callable[[int], bool]) -> list[int]:
    """Make the engine's host copies raise on the calls `fail(call number)` picks; returns the failed call numbers.
    The failing copy first writes garbage into the target slots, as a copy cut off half-way would."""
    pool = engine.tiers.host_pool
    real = pool.save
    failed: list[int] = []
    calls = [0]

    def save(device_pool, blocks, slots) -> None:
        calls[0] += 1
        if fail(calls[0]):
            failed.append(calls[0])
            pool.kv[:, :, slots] = 1e3
            raise RuntimeError("injected: device-to-host copy failed")
        real(device_pool, blocks, slots)

    pool.save = save
    return failed


def _run_one_by_one(engine: Engine, prompts: list[list[int]]) -> list[list[int] | None]:
    out: list[list[int] | None] = []
    for p in prompts:
        try:
            out.append(engine.generate(p, max_new_tokens=MAX_NEW).token_ids)
        except Exception:
            out.append(None)  # the request that owned the fault may fail (it must fail alone)
    return out


@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_a_failed_host_copy_never_serves_wrong_kv(model: RandomModel, policy: str) -> None:
    prompts = _prompts(model.config.vocab_size, 6)
    with Engine(model, capacity_blocks=400, page_size=PAGE, enable_cache=False, dtype="float64") as plain:
        want = [plain.generate(p, max_new_tokens=MAX_NEW).token_ids for p in prompts]
    with _engine(model, policy) as engine:
        failed = _failing_saves(engine, lambda n: n <= 2)  # the first two copies to the host fail
        first = _run_one_by_one(engine, prompts)
        assert failed == [1, 2]
        engine.check()
        again = _run_one_by_one(engine, prompts)  # every prompt again: demoted ones come back from the host
        assert again == want
        served = [(got, w) for got, w in zip(first, want, strict=True) if got is not None]
        assert all(got == w for got, w in served)
        assert engine.stats.tiers.host_loaded_pages > 0
        engine.check()


def test_copies_failing_during_eviction_keep_the_counters_right(model: RandomModel) -> None:
    prompts = _prompts(model.config.vocab_size, 8)
    with _engine(model, "write_back") as engine:
        failed = _failing_saves(engine, lambda n: n % 2 == 1)  # every other eviction's copy fails
        _run_one_by_one(engine, prompts)
        assert failed
        gauges = engine.check()  # raises if a counter went wrong
        host = engine.tiers.host
        assert host.free_count + host.evictable_count + host.locked_count == host.capacity
        assert gauges == engine.check()
        _run_one_by_one(engine, prompts[::-1])
        engine.check()


def test_a_failed_host_to_device_load_is_recomputed(model: RandomModel) -> None:
    prompts = _prompts(model.config.vocab_size, 6)
    with Engine(model, capacity_blocks=400, page_size=PAGE, enable_cache=False, dtype="float64") as plain:
        want = [plain.generate(p, max_new_tokens=MAX_NEW).token_ids for p in prompts]
    with _engine(model, "write_through") as engine:
        pool = engine.tiers.host_pool
        real = pool.load
        calls = [0]

        def load(device_pool, slots, blocks):
            calls[0] += 1
            if calls[0] % 2:
                device_pool.kv[:, :, list(blocks)[:1]] = -7.0  # half-copied garbage, then the failure
                raise RuntimeError("injected: host-to-device copy failed")
            return real(device_pool, slots, blocks)

        pool.load = load
        assert _run_one_by_one(engine, prompts) == want
        assert _run_one_by_one(engine, prompts) == want
        assert calls[0] > 1 and engine.stats.tiers.host_failed_copies > 0
        engine.check()
