"""A disk tier that turned itself off (a write failed: a full disk, a file size limit) shows in `engine.stats`
(`disk_tier_up` 0, `engine.tiers.disk.disabled_reason`) and on /metrics (`radixcache_disk_tier_up` 0), and the
cluster's front door reports the live replicas' gauge, not a counter's sum over dead ones. Until 2026-12-07 only
`disk_dropped_pages` growing and one log warning showed it."""

from __future__ import annotations

import dataclasses
import errno
import random
from pathlib import Path

from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.cluster.tally import Counters
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model


def _metric(text: str, name: str) -> list[float]:
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]


def test_a_disk_tier_that_turned_itself_off_shows_in_stats_and_metrics(tmp_path: Path) -> None:
    m = tiny_model(seed=3)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    rng = random.Random(2)
    engine = Engine(model, capacity_blocks=60, page_size=4, cache_dir=tmp_path / "kv", dtype="float32")
    try:
        with TestClient(create_app(engine, "tiny")) as client:
            body = {"model": "tiny", "prompt": [rng.randrange(1, 97) for _ in range(24)], "max_tokens": 2}
            assert client.post("/v1/completions", json=body).status_code == 200
            assert engine.flush(30)
            assert engine.stats.disk_tier_up == 1 and engine.tiers.disk.disabled_reason is None
            assert _metric(client.get("/metrics").text, "radixcache_disk_tier_up") == [1.0]

            def too_large(write):  # RLIMIT_FSIZE reached: every write fails
                raise OSError(errno.EFBIG, "File too large")

            engine.tiers.disk._write_page = too_large
            body["prompt"] = [rng.randrange(1, 97) for _ in range(24)]
            assert client.post("/v1/completions", json=body).status_code == 200
            assert engine.flush(30)
            stats = engine.stats
            assert stats.disk_tier_up == 0 and "File too large" in engine.tiers.disk.disabled_reason
            assert _metric(client.get("/metrics").text, "radixcache_disk_tier_up") == [0.0]
        # Behind replicas: the live replicas' gauge (one up, one off: 1), whatever earlier readings said.
        counters = Counters()
        up = dataclasses.replace(stats, disk_tier_up=1)
        counters.total({0: ("a", up), 1: ("b", up)})
        assert counters.total({0: ("a", up), 1: ("b", stats)}).disk_tier_up == 1
    finally:
        engine.close()


def test_an_engine_without_a_cache_dir_exports_no_disk_tier_gauge() -> None:
    m = tiny_model(seed=3)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    with Engine(model, capacity_blocks=20, page_size=4, dtype="float32") as engine:
        assert engine.stats.disk_tier_up is None
        with TestClient(create_app(engine, "tiny")) as client:
            assert _metric(client.get("/metrics").text, "radixcache_disk_tier_up") == []
