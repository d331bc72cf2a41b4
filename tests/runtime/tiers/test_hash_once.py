"""A request's page hashes are computed once, whoever needs them first: a tier's refresh of a device hit (deferred,
radixcache.page_hash.DeferredHashes) or the request's own commit (its PageChain)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from radixcache import page_hash
from radixcache.page_hash import PageChain
from radixcache.runtime import Engine
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

P = 4


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=5)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pages hashed by each chain_hashes call from now on."""
    pages: list[int] = []
    real = page_hash.chain_hashes

    def counting(tokens: Sequence[int], page_size: int, parent: bytes) -> list[bytes]:
        pages.append(len(tokens) // page_size)
        return real(tokens, page_size, parent)

    monkeypatch.setattr(page_hash, "chain_hashes", counting)
    return pages


@pytest.mark.parametrize("first", ["deferred", "chain"])
def test_a_chain_takes_the_hashes_its_deferred_run_computed_and_the_other_way(hashed: list[int], first: str) -> None:
    tokens = list(range(1, 8 * P + 1))
    want = PageChain(b"root", P).upto(tokens, 8)
    hashed.clear()
    chain = PageChain(b"root", P)
    chain.upto(tokens, 2)
    later = chain.deferred(tokens, 6)
    assert callable(later) and len(later) == 6
    if first == "deferred":
        assert later() == want[:6]
        assert chain.upto(tokens, 8) == want
    else:
        assert chain.upto(tokens, 8) == want
        assert later() == want[:6]
    assert sum(hashed) == 8  # each page once


def test_a_device_hit_then_a_commit_hashes_the_prompt_once_with_a_host_tier_and_no_disk(
    model: RandomModel, hashed: list[int]
) -> None:
    """The host tier hashed a device hit's run (deferred: a prompt the device holds whole is not hashed at admission)
    at its next use, from a copy of the tokens, and the request's commit hashed the same prompt again on its chain."""
    rng = random.Random(2)
    prompt = [rng.randrange(1, model.config.vocab_size) for _ in range(8 * P)]
    host_bytes = 64 * P * model.config.kv_bytes_per_token(4)
    with Engine(model, capacity_blocks=400, page_size=P, host_kv_memory=host_bytes) as engine:
        engine.generate(prompt, 1)
        hashed.clear()
        got = engine.generate(prompt, 2 * P + 1, ignore_eos=True)  # whole on the device, then 2 pages of output
        assert got.cached_tokens == 8 * P - 1
        assert engine.tiers.host is not None and engine.tiers.host.stats.stored >= 10
    assert sum(hashed) == 10  # the prompt's 8 pages and the output's 2, each once
