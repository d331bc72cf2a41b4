"""Fixtures for the fault-isolation tests: the tiny random model with its toy tokenizer, token ids, and the check
that an engine holds nothing for requests that left. The tests run it in float64: a batch that changes because one
request failed never flips a near-tie of its logits, so a bystander's output must equal its output alone exactly."""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model


@pytest.fixture(scope="session")
def tiny() -> RandomModel:
    m = tiny_model(seed=7)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_clean(engine: Engine) -> None:
    """Invariants true (radixcache/invariants.py), no block held by a request, only pins lock blocks, the loop idle."""
    assert engine.wait_idle(30)
    c = engine.cache
    gauges = engine.check()
    assert gauges is not None
    c.check_invariants()
    assert c.held_blocks == 0
    assert c.locked_blocks == engine.stats.pinned_blocks
    assert c.free_blocks + c.evictable_blocks + c.locked_blocks == c.capacity_blocks
    assert not engine.scheduler.has_work()
