"""The tiers' contained failures are visible: a host copy that raised (`host_failed_copies`) and a disk write
dropped (`disk_dropped_pages`) are counted in `engine.stats.tiers`, summed over replicas by the cluster's front
door, and exported on /metrics as `radixcache_tier_host_failed_copies_total` and
`radixcache_tier_disk_dropped_pages_total`. In-process app over the tiny random model with a host tier and a cache
directory; the failures are injected into the engine's own host pool and disk store."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.cluster.front import _add
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

PAGE = 4


def _metric(text: str, name: str) -> float:
    rows = [line for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " ")]
    assert len(rows) == 1, (name, rows)
    return float(rows[0].rsplit(" ", 1)[1])


def test_failed_host_copies_and_dropped_disk_pages_reach_stats_and_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = tiny_model(seed=11)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    host = 200 * PAGE * model.config.kv_bytes_per_token(4)
    engine = Engine(
        model, capacity_blocks=40, page_size=PAGE, host_kv_memory=host, cache_dir=tmp_path / "kv", dtype="float32"
    )
    tiers = engine.tiers
    real_save, real_put, calls = tiers.host_pool.save, tiers.disk.put, [0, 0]

    def save(*args, **kwargs):  # every other device-to-host copy raises
        calls[0] += 1
        if calls[0] % 2:
            raise RuntimeError("injected: device-to-host copy failed")
        return real_save(*args, **kwargs)

    def put(*args, **kwargs):  # every third disk write fails to queue
        calls[1] += 1
        if calls[1] % 3 == 0:
            raise RuntimeError("injected: queueing a disk write failed")
        return real_put(*args, **kwargs)

    monkeypatch.setattr(tiers.host_pool, "save", save)
    monkeypatch.setattr(tiers.disk, "put", put)
    rng = random.Random(5)
    try:
        with TestClient(create_app(engine, "tiny")) as client:
            for _ in range(4):
                prompt = [rng.randrange(1, 97) for _ in range(40)]
                body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0}
                assert client.post("/v1/completions", json=body).status_code == 200
            assert engine.flush(30)
            counters = engine.stats.tiers
            assert counters.host_failed_copies > 0 and counters.disk_dropped_pages > 0
            text = client.get("/metrics").text
            assert _metric(text, "radixcache_tier_host_failed_copies_total") == counters.host_failed_copies
            assert _metric(text, "radixcache_tier_disk_dropped_pages_total") == counters.disk_dropped_pages
            assert client.get("/health/cache").status_code == 200
        # Behind replicas, the front door sums the replicas' EngineStats field by field, the tier counters too.
        stats = engine.stats
        summed = _add(stats, dataclasses.replace(stats))
        assert summed.tiers.host_failed_copies == 2 * counters.host_failed_copies
        assert summed.tiers.disk_dropped_pages == 2 * counters.disk_dropped_pages
    finally:
        engine.close()
