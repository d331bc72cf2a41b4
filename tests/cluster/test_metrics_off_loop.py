"""The server's event loop never waits on a slow /metrics gather (behind replicas, `engine.stats` is a Ray call to
each replica): a /health sent while /metrics waits on slow stats answers at once. In-process app over the tiny
random model, with an engine whose stats take a second, as a slow replica's do."""

from __future__ import annotations

import threading
import time

from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

SLOW_S = 0.6


class SlowStatsEngine(Engine):
    """An Engine whose stats take SLOW_S seconds, like a gather over replicas that answer slowly."""

    @property
    def stats(self):  # type: ignore[override]
        time.sleep(SLOW_S)
        return super().stats


def test_health_answers_while_metrics_waits_on_slow_stats() -> None:
    m = tiny_model(seed=4)
    engine = SlowStatsEngine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=64)
    try:
        with TestClient(create_app(engine, "tiny", public_metrics=True)) as client:
            scraped: list[int] = []
            scrape = threading.Thread(target=lambda: scraped.append(client.get("/metrics").status_code))
            scrape.start()
            time.sleep(0.15)  # the scrape is inside engine.stats now
            t0 = time.perf_counter()
            assert client.get("/health").status_code == 200
            waited = time.perf_counter() - t0
            scrape.join(10)
            assert scraped == [200]
            assert waited < SLOW_S / 2, f"/health waited {waited:.2f} s behind /metrics"
    finally:
        engine.close()
