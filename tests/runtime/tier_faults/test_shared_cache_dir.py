"""Two live engines (or stores) on one cache directory: each finds the pages the other writes after it opened, and
serves them as the other wrote them; a directory that is not ours is still never read.

Until 2026-12-07 a store knew only the pages on disk at its open and its own writes, so two replicas sharing
`--cache-dir` recomputed every prefix the other had written, until a restart.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.conftest import FP, META, h, page_path, payload, toks, write


def test_a_store_finds_the_pages_another_store_wrote_after_it_opened(open_store, tmp_path: Path) -> None:
    reader = open_store()
    writer = open_store()
    write(writer, 0, 1, 2)
    chain = [h(i) for i in range(4)]
    assert reader.count_prefix(chain) == 3  # the 4th is on no disk
    assert [reader.read(h(i), toks(i)) for i in range(3)] == [(payload(i), META) for i in range(3)]
    assert reader.stats().pages == 3  # they joined its index (and its size limit)


def test_a_lookup_past_the_index_stops_at_the_first_page_missing(open_store) -> None:
    reader = open_store()
    writer = open_store()
    write(writer, 0, 2)
    assert reader.count_prefix([h(0), h(1), h(2)]) == 1
    assert h(2) not in reader  # past the gap: not looked up


def test_another_fingerprint_s_pages_are_not_found(open_store) -> None:
    reader = open_store(fingerprint=FP + "/other")
    write(open_store(), 0, 1)
    assert reader.count_prefix([h(0), h(1)]) == 0


def test_a_directory_that_is_not_ours_is_never_looked_into(open_store, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    write(open_store(), 0, 1)
    (cache / "radixcache-cache.json").write_text('{"format": "someone-else"}')
    refused = open_store()
    assert not refused.enabled
    assert refused.count_prefix([h(0), h(1)]) == 0


def test_two_live_engines_share_what_each_writes(tmp_path: Path) -> None:
    m = tiny_model(seed=5)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    rng = random.Random(1)
    prompt = [rng.randrange(1, m.config.vocab_size) for _ in range(64)]
    opts = {"capacity_blocks": 100, "page_size": 4, "dtype": "float64"}
    with Engine(model, enable_cache=False, **opts) as plain:
        want = plain.generate(prompt, 4).token_ids
    tiers = {"cache_dir": tmp_path / "kv", "load_back": "always"}
    with Engine(model, **opts, **tiers) as a, Engine(model, **opts, **tiers) as b:
        assert a.generate(prompt, 4).token_ids == want
        assert a.flush(30)
        got = b.generate(prompt, 4)
        assert got.token_ids == want
        assert got.cached_tokens == 63  # the whole prompt but its last token, which is computed
        assert b.stats.tiers.disk_hit_tokens == 63
        assert b.stats.tiers.disk_failed_reads == 0
        b.check()


@pytest.mark.parametrize("link", ["fingerprint", "hash"])
def test_a_lookup_past_the_index_follows_no_symlinked_folder(open_store, tmp_path: Path, link: str) -> None:
    """The pages another store wrote, moved behind a symlinked fingerprint folder (`pages/<tag>`) or hash folder
    (`pages/<tag>/<2 hex>`): the listing at open skips them, and so does a lookup past the index."""
    reader = open_store()
    writer = open_store()
    write(writer, 0)
    folder = page_path(writer, h(0)).parent
    if link == "fingerprint":
        folder = folder.parent
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    folder.symlink_to(moved, target_is_directory=True)
    assert reader.count_prefix([h(0)]) == 0
    assert reader.read(h(0), toks(0)) is None
    assert open_store().count_prefix([h(0)]) == 0  # as the listing at open
