"""`/health/cache`'s `queued` behind replicas: the front door's requests that no replica has started yet (before, the
front door's `queue.waiting` was a constant 0, so a request held before its replica started it was never seen).
Replicas are stand-ins (tests/cluster/stand_in.py); no Ray."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.cluster.stand_in import echo_script, install


def test_health_cache_counts_the_requests_no_replica_has_started(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.server import create_app

    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None)
    engine = ClusterEngine(cluster, str(tiny_dir))
    gate = threading.Event()

    def held(prompt: list[int], options: Any) -> list[Any]:  # replica 0 starts nothing until the gate opens
        return [lambda: gate.wait(30), *echo_script(prompt, options)]

    cluster.actor(0).script = held
    with TestClient(create_app(engine, "tiny")) as client:
        try:
            assert client.get("/health/cache").json()["queued"] == 0
            waiting = engine.submit([5, 6, 7], 2)  # round robin: replica 0, held
            assert client.get("/health/cache").json()["queued"] == 1
            assert engine.generate([5, 6, 8], 2).finish_reason == "length"  # replica 1 starts and ends it
            assert client.get("/health/cache").json()["queued"] == 1  # the held one still waits
            gate.set()
            assert waiting.result(30).token_ids == (7, 7)
            assert client.get("/health/cache").json()["queued"] == 0
        finally:
            gate.set()  # before the server's shutdown drains the held request
    engine.close()
