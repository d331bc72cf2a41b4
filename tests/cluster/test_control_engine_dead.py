"""A replica whose engine loop died (EngineDeadError inside a live actor) is a dead replica for every call, not only
for requests: /health/cache (`check`), /metrics (`stats`), `unpin` and the replay's warm-up relayed its error
instead (with Ray, a 503 engine_dead for the whole front door), and left it in the routing set. An idle replica
drew no request to find it dead, so a load balancer that probes /health/cache took every live replica out of
rotation for good. Now those calls drop it and end its actor for Ray to restart, as a request does, and answer
from the live replicas. Replicas are stand-ins (tests/cluster/stand_in.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime.engine.errors import EngineDeadError
from tests.cluster.stand_in import RayTaskError, install


def _front(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> tuple[Any, list[tuple[Any, bool]]]:
    ray = install(monkeypatch)
    killed: list[tuple[Any, bool]] = []
    ray.kill = lambda actor, no_restart=True: killed.append((actor, no_restart))
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    return ClusterEngine(ReplicaCluster("fake", 2, poll_interval=None), str(tiny_dir)), killed


def _engine_dead() -> RayTaskError:
    return RayTaskError(EngineDeadError(RuntimeError("the loop broke")))


def test_health_cache_drops_a_replica_whose_engine_died(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> None:
    from radixcache.runtime.server import create_app

    engine, killed = _front(monkeypatch, tiny_dir)
    broken = engine.cluster.actor(0)
    broken.fail["check"] = _engine_dead()
    with TestClient(create_app(engine, "tiny")) as client:
        response = client.get("/health/cache")
        assert response.status_code == 200, response.text
        assert response.json() == {"invariants": "ok", "used_blocks": 0, "queued": 0}  # replica 1's gauges
        assert engine.cluster.alive == (1,) and killed == [(broken, False)]  # ended for Ray to restart it
    engine.close()


@pytest.mark.parametrize("method", ["stats", "unpin"])
def test_control_calls_drop_a_replica_whose_engine_died(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path, method: str
) -> None:
    engine, killed = _front(monkeypatch, tiny_dir)
    broken = engine.cluster.actor(1)
    broken.fail[method] = _engine_dead()
    broken._unpin = engine.cluster.actor(0)._unpin = lambda *_: 2  # each live replica released two pins
    try:
        if method == "stats":
            assert [s.prompt_tokens for s in engine.cluster.replica_stats()] == [100]  # replica 0's (stand_in)
        else:
            assert engine.unpin() == 2
        assert engine.cluster.alive == (0,) and killed == [(broken, False)]
    finally:
        engine.close()


def test_the_warm_up_drops_a_replica_whose_engine_died(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> None:
    engine, killed = _front(monkeypatch, tiny_dir)
    broken = engine.cluster.actor(0)
    broken.fail["generate"] = _engine_dead()
    try:
        engine.warm_up([1, 2, 3, 4], 2, namespace="warm")
        assert engine.cluster.alive == (1,) and killed == [(broken, False)]
        assert [row["replica"] for row in engine.per_replica()] == [1]
    finally:
        engine.close()
