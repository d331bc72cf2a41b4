"""A page file that cannot be read for its permissions (EACCES: its mode changed under the cache, or another user's
file in a shared directory) leaves the store's index, as a missing or corrupt page does: the request recomputes it,
later lookups no longer claim it (also not by finding its file past the index), and the recomputed page is written
again, in its place. Before, it stayed indexed: every later request hit it again, failed the read and recomputed it
and every page after it, and the page was never rewritten (the store held it). A read failing with EIO is a
transient miss (tests/runtime/tier_faults/test_disk_faults.py) until three reads of the page in a row failed. The
error is injected at the open of that file (root ignores file modes); the chmod variant runs where the tests do not
run as root."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.conftest import META, h, needs_permissions, page_path, payload, toks, write
from tests.runtime.tier_faults.fs_faults import unreadable

OPTS = {"capacity_blocks": 100, "page_size": 4, "dtype": "float64", "load_back": "always"}


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM])
def test_an_unreadable_page_leaves_the_index_and_is_written_again(open_store, monkeypatch, code: int) -> None:
    store = open_store()
    write(store, 0, 1)
    bad = page_path(store, h(0))
    with monkeypatch.context() as m:
        unreadable(m, bad, code)
        assert store.read(h(0), toks(0)) is None
        assert store.count_prefix([h(0), h(1)]) == 0  # no longer claimed, though its file is still there
        assert bad.exists() and store.stats().corrupt_pages == 0
        write(store, 0)  # recomputed and adopted again: written in its place (a new, readable file)
        assert store.read(h(0), toks(0)) == (payload(0), META)
        assert store.count_prefix([h(0), h(1)]) == 2


def test_a_page_whose_reads_keep_failing_with_eio_leaves_the_index_after_three(open_store, monkeypatch) -> None:
    """EIO may pass (test_disk_faults: one failed read keeps the page), but a bad sector fails every read: after 3 in
    a row the page leaves the index as an unreadable one does, and is written again (a new file, new blocks)."""
    store = open_store()
    write(store, 0, 1)
    with monkeypatch.context() as m:
        unreadable(m, page_path(store, h(0)), errno.EIO)
        for _ in range(2):
            assert store.read(h(0), toks(0)) is None and store.count_prefix([h(0), h(1)]) == 2  # kept: may pass
    assert store.read(h(0), toks(0)) == (payload(0), META)  # it passed: the count in a row starts again
    with monkeypatch.context() as m:
        unreadable(m, page_path(store, h(0)), errno.EIO)
        for _ in range(2):
            assert store.read(h(0), toks(0)) is None and store.count_prefix([h(0)]) == 1
        assert store.read(h(0), toks(0)) is None and store.count_prefix([h(0), h(1)]) == 0  # the third in a row
        write(store, 0)
        assert store.read(h(0), toks(0)) == (payload(0), META) and store.count_prefix([h(0), h(1)]) == 2
    assert store.stats().corrupt_pages == 0


@needs_permissions
def test_a_page_chmodded_to_000_leaves_the_index(open_store) -> None:
    store = open_store()
    write(store, 0)
    bad = page_path(store, h(0))
    os.chmod(bad, 0)
    assert store.read(h(0), toks(0)) is None and store.count_prefix([h(0)]) == 0
    write(store, 0)
    assert store.read(h(0), toks(0)) == (payload(0), META)


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=5)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def test_an_engine_recomputes_an_unreadable_page_once_then_serves_it_again(model, tmp_path: Path, monkeypatch) -> None:
    prompt = [random.Random(4).randrange(1, model.config.vocab_size) for _ in range(40)]  # 10 pages of 4
    with Engine(model, enable_cache=False, **OPTS) as plain:
        want = plain.generate(prompt, 4).token_ids
    cache = tmp_path / "kv"
    with Engine(model, cache_dir=cache, **OPTS) as first:
        first.generate(prompt, 4)
    with Engine(model, cache_dir=cache, **OPTS) as probe:
        paths = [Path(probe.tiers.disk.layout.page_path(x)) for x in probe.tiers.chain(None).upto(prompt, 10)]
    unreadable(monkeypatch, paths[5])
    with Engine(model, cache_dir=cache, **OPTS) as engine:
        got = engine.generate(prompt, 4)
        assert got.token_ids == want and got.cached_tokens == 20  # the 5 pages before the unreadable one
        assert engine.flush(30)
        engine.cache.evict(engine.cache.evictable_blocks)  # the next request finds the run on disk alone
        again = engine.generate(prompt, 4)
        tiers = engine.stats.tiers
        engine.check()
    assert again.token_ids == want and again.cached_tokens == 39  # all but the last token: the page written again
    assert (tiers.disk_failed_reads, tiers.disk_loaded_pages) == (1, 15)
