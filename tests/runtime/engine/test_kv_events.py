"""The engine's cache events (runtime.kv.events): a router index fed by them holds exactly the page keys of the
engine's tree, through evictions, requests that arrive while others run, and tiers; a receiver that fell behind the
kept history resyncs from a snapshot; and the index's match for a prompt is the tree's own."""

from __future__ import annotations

import random
import time

import pytest

from radixcache.page_hash import chain_hashes, root_hash
from radixcache.router import RouterIndex
from radixcache.runtime import Engine
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=3)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def _tree_keys(engine: Engine) -> set[bytes]:
    """Every page key of the engine's tree, computed independently: each node's pages, hashed along its path."""
    p = engine.cache.page_size
    keys: set[bytes] = set()
    for node in engine.cache.iter_nodes():
        path = chain_hashes(node.tokens(), p, root_hash(engine.fingerprint, node.namespace))
        keys.update(path[node.prefix_len // p :])
    return keys


def _prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    systems = [[rng.randrange(vocab) for _ in range(20)] for _ in range(3)]
    return [systems[i % 3] + [rng.randrange(vocab) for _ in range(rng.randrange(2, 12))] for i in range(n)]


def _sync(index: RouterIndex, engine: Engine) -> None:
    batches = engine.events.since(index.last_seq(0))
    if batches is None:
        seq, keys = engine.events.snapshot()
        index.resync(0, seq, keys)
        return
    for batch in batches:
        assert index.apply(batch)


@pytest.mark.parametrize("page_size", [1, 4])
def test_an_index_fed_by_the_events_holds_exactly_the_tree(model: RandomModel, page_size: int) -> None:
    engine = Engine(model, capacity_blocks=120 // page_size, page_size=page_size, kv_events=True)
    index = RouterIndex()
    index.add_replica(0)
    prompts = _prompts(model.config.vocab_size, 18, seed=page_size)
    with engine:
        for wave in range(0, len(prompts), 3):
            handles = engine.submit(prompts[wave : wave + 3], max_new_tokens=4)
            time.sleep(0.002)
            _sync(index, engine)  # mid-flight: pages are committed while requests run
            for h in handles:
                h.result(timeout=60)
            _sync(index, engine)
            assert index.keys(0) == _tree_keys(engine)
        assert engine.cache.stats.evicted_blocks > 0  # removals were exercised
        for prompt in prompts:
            keys = engine.events.chain(None).upto(prompt, len(prompt) // page_size)
            assert index.matched_pages(0, keys) * page_size == engine.cache.peek(prompt).length


def test_a_receiver_behind_the_history_resyncs_from_a_snapshot(model: RandomModel) -> None:
    engine = Engine(model, capacity_blocks=40, page_size=4, kv_events=True)
    engine.events.set_history(2)  # keep two batches only
    index = RouterIndex()
    index.add_replica(0)
    with engine:
        for prompt in _prompts(model.config.vocab_size, 8, seed=5):
            engine.generate(prompt, max_new_tokens=3)
            engine.events.take()  # one batch per request: the receiver misses most of them
        assert engine.events.since(0) is None  # batch 1 is gone: resync
        _sync(index, engine)
        assert index.keys(0) == _tree_keys(engine)
        assert index.last_seq(0) == engine.events.seq
        engine.generate(_prompts(model.config.vocab_size, 1, seed=9)[0], max_new_tokens=3)
        _sync(index, engine)  # back to plain batches
        assert index.keys(0) == _tree_keys(engine)


def test_events_chain_the_tiers_eviction_listener(model: RandomModel, tmp_path) -> None:
    engine = Engine(model, capacity_blocks=30, page_size=4, kv_events=True, host_kv_memory=1 << 20)
    index = RouterIndex()
    index.add_replica(0)
    with engine:
        for prompt in _prompts(model.config.vocab_size, 10, seed=7):
            engine.generate(prompt, max_new_tokens=3)
        _sync(index, engine)
        assert index.keys(0) == _tree_keys(engine)
        assert engine.stats.tiers.host_saved_pages > 0 and engine.cache.stats.evicted_blocks > 0


def test_namespaces_and_engines_without_events() -> None:
    m = tiny_model(seed=3)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    assert Engine(model, capacity_blocks=10).events is None
    assert Engine(model, capacity_blocks=10, enable_cache=False, kv_events=True).events is None
    engine = Engine(model, capacity_blocks=40, page_size=4, kv_events=True)
    with engine:
        prompt = _prompts(model.config.vocab_size, 1, seed=1)[0]
        engine.generate(prompt, max_new_tokens=2, namespace="tenant-a")
        _, keys = engine.events.snapshot()
        other = set(engine.events.chain(None).upto(prompt, len(prompt) // 4))
        mine = set(engine.events.chain("tenant-a").upto(prompt, len(prompt) // 4))
        assert mine <= keys and not other & keys  # another namespace's keys never match
