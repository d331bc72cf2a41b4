"""A disk that fills while pages wait in the write queue: the engine's `disk_dropped_pages` (/metrics'
radixcache_tier_disk_dropped_pages_total) counts every page that never became a file, also those queued before the
first write failed, which the writer then drops (the store pauses writing). Until 2026-12-07 those showed as
queued only: a full disk's pages looked written."""

from __future__ import annotations

import errno
import random
import threading
from pathlib import Path

from radixcache.runtime import Engine
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model


def test_pages_queued_before_a_full_disk_failed_their_write_count_as_dropped(tmp_path: Path) -> None:
    m = tiny_model(seed=5)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    rng = random.Random(4)
    prompt = [rng.randrange(1, m.config.vocab_size) for _ in range(40)]  # 10 pages of 4
    opts = {"capacity_blocks": 100, "page_size": 4, "dtype": "float64"}
    with Engine(model, enable_cache=False, **opts) as plain:
        want = plain.generate(prompt, 4).token_ids
    with Engine(model, cache_dir=tmp_path / "kv", **opts) as engine:
        store = engine.tiers.disk
        go = threading.Event()

        def full_disk(write):  # the writer's first write waits until every page is queued, then finds no space
            go.wait(30)
            raise OSError(errno.ENOSPC, "No space left on device")

        store._write_page = full_disk
        assert engine.generate(prompt, 4).token_ids == want
        queued = engine.stats.tiers.disk_queued_pages
        assert queued >= 10  # the prompt's pages (and a decode page's) were all queued
        go.set()
        assert engine.flush(30)
        tiers = engine.stats.tiers
        assert not store.enabled
        assert (tiers.disk_queued_pages, tiers.disk_dropped_pages) == (queued, queued)
    assert list((tmp_path / "kv").rglob("*.kvpage")) == []
