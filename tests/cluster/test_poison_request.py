"""A request that kills its replica (a native crash, an OOM kill) is re-sent at most once: before, it was re-sent to
each live replica in turn and took every one of them down. Without Ray: the stand-in's replicas die under it on
demand (tests/cluster/stand_in.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixcache.runtime.engine.errors import ReplicaUnavailableError
from tests.cluster.stand_in import RayActorError, install


def _poison(prompt: list[int], options: object) -> list[object]:
    return [RayActorError("the actor died")]


def test_a_request_that_kills_its_replicas_fails_after_the_second(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path):
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster("fake", 4, router="round_robin", poll_interval=None, call_timeout=5.0)
    front = ClusterEngine(cluster, str(tiny_dir))
    try:
        for r in range(4):
            cluster.actor(r).script = _poison
        with pytest.raises(ReplicaUnavailableError, match="not re-sent again"):
            front.generate([5, 6, 7, 8], 3)
        sent = [r for r in range(4) if cluster.actor(r).streams]
        assert len(sent) == 2 and len(cluster.alive) == 2  # two replicas down, two never offered it
        assert cluster.stats().deaths == 2 and cluster.stats().retries == 1
        assert cluster.loads.in_flight() == 0
    finally:
        front.close()


def test_the_blocking_generate_re_sends_once_too(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    cluster = ReplicaCluster("fake", 3, router="round_robin", poll_interval=None, call_timeout=5.0)
    try:
        for r in range(3):
            cluster.actor(r).fail["generate"] = RayActorError("the actor died")
        with pytest.raises(ReplicaUnavailableError, match=r"replicas \d, \d died while serving this request"):
            cluster.generate([1, 2, 3], 2)
        assert len(cluster.alive) == 1 and cluster.stats().deaths == 2 and cluster.loads.in_flight() == 0
    finally:
        cluster.close()
