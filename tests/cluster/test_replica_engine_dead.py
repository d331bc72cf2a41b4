"""A replica whose engine loop died inside a live actor (EngineDeadError: "this engine serves no more") is a dead
replica: it leaves the routing set, the request is re-sent to another (no token was sent), and its actor is ended
for Ray to restart; it rejoins only under a new incarnation. Replicas are stand-ins (tests/cluster/stand_in.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime.engine.errors import EngineDeadError, ReplicaUnavailableError
from tests.cluster.stand_in import RayTaskError, echo_script, install


def _dead_engine(prompt: list[int], options: Any) -> list[Any]:
    return [RayTaskError(EngineDeadError(RuntimeError("a bug in the loop")))]


def test_a_replica_whose_engine_died_is_dropped_and_restarted(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> None:
    """Regression: the replica stayed in the routing set, idle (its requests failed at once), so cache_aware and
    least_loaded sent it every request they could, each failing with EngineDeadError until the server restarted."""
    ray = install(monkeypatch)
    killed: list[tuple[Any, bool]] = []
    ray.kill = lambda actor, no_restart=True: killed.append((actor, no_restart))
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster("fake", 2, router="least_loaded", poll_interval=None)
    engine = ClusterEngine(cluster, str(tiny_dir))
    broken = cluster.actor(0)
    broken.script = _dead_engine
    try:
        results = [engine.submit([1, 2, i], 2).result(timeout=10) for i in range(4)]
        assert [r.token_ids for r in results] == [(i, i) for i in range(4)]  # each served by replica 1
        assert cluster.alive == (1,) and cluster.stats().retries == 1
        assert killed == [(broken, False)]  # ended for Ray to restart it
        assert cluster.actor_died(0, _dead_engine([], None)[0])  # a second request's news of the same death
        assert killed == [(broken, False)]  # ... ends nothing more (it could end the restarted process)
        cluster.poll()  # the old process still answers with its incarnation: it does not rejoin
        assert cluster.alive == (1,)
        broken.replica, broken.script = 7, echo_script  # restarted: a new incarnation ("i7"), a working engine
        cluster.poll()
        assert cluster.alive == (0, 1)
    finally:
        engine.close()


def test_a_request_with_tokens_on_a_replica_whose_engine_died_fails_with_503(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster("fake", 1, poll_interval=None)
    engine = ClusterEngine(cluster, str(tiny_dir))
    cluster.actor(0).script = lambda prompt, options: [("tokens", [5], [None]), *_dead_engine(prompt, options)]
    try:
        with pytest.raises(ReplicaUnavailableError, match="engine loop thread died"):
            engine.submit([1, 2, 3], 2).result(timeout=10)
        assert cluster.alive == () and cluster.loads.in_flight() == 0
    finally:
        engine.close()


def test_engine_dead_error_survives_pickling() -> None:
    """Regression: Ray pickles a replica's errors to send them; EngineDeadError was rebuilt from its message (a str
    for its cause), which failed, and the front door got Ray's UnserializableException: a 500, and never a retry."""
    import pickle

    error = pickle.loads(pickle.dumps(EngineDeadError(RuntimeError("a bug in the loop"))))
    assert type(error) is EngineDeadError and type(error.cause) is RuntimeError
    assert str(error) == "the engine loop thread died: RuntimeError: a bug in the loop; this engine serves no more"
