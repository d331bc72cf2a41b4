"""A preempted request resumes with its prompt and output so far, and needs the K/V of every token but the last: at
page size 1 the tiers may hold the last token's page too (another request went further), and the load must stop
where the request's new blocks end."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=5)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


@pytest.mark.parametrize("tier", ["disk", "host"])
def test_a_resumed_request_loads_its_pages_at_page_size_one(model: RandomModel, tmp_path: Path, tier: str) -> None:
    """The tiers planned every page they held of the resumed request's tokens, its last token's page included, for
    the blocks up to its last token only: the copy raised ('10 source pages for 9 destination pages'), was logged as a
    failure, and the request recomputed every page it had found."""
    rng = random.Random(0)
    vocab = model.config.vocab_size
    a, b = ([rng.randrange(1, vocab) for _ in range(10)] for _ in range(2))
    with Engine(model, capacity_blocks=200, page_size=1) as base:
        want = [r.token_ids for r in base.generate([a, b], 20, ignore_eos=True)]
    host = {"host_kv_memory": 200 * model.config.kv_bytes_per_token(4)} if tier == "host" else {}
    kwargs = {"page_size": 1, "load_back": "always", **host}
    if tier == "disk":
        kwargs["cache_dir"] = tmp_path
        with Engine(model, capacity_blocks=200, **kwargs) as first:  # every page of both runs on disk
            first.generate(a, 20, ignore_eos=True)
            first.generate(b, 20, ignore_eos=True)
            assert first.flush(30)
    with Engine(model, capacity_blocks=45, **kwargs) as engine:  # room for one run and a half: b is preempted
        if tier == "host":  # every page of both runs in the host tier
            engine.generate(a, 20, ignore_eos=True)
            engine.generate(b, 20, ignore_eos=True)
        got = engine.generate([a, b], 20, ignore_eos=True)
        tiers = engine.stats.tiers
    assert [r.token_ids for r in got] == want
    assert got[1].preemptions >= 1
    assert (tiers.disk_failed_reads, tiers.host_failed_copies) == (0, 0)
    assert got[1].recomputed_tokens < 10  # its pages came from the tier
