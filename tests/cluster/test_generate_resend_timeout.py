"""ReplicaCluster.generate (the blocking call) re-sends a request whose replica died to another, and its `timeout`
counts from when the front door took it there too, as a stream's does (docs/replicas.md): the replica is told the
seconds already spent and shortens its deadline by them. Before, the second replica got the whole timeout again,
so a request re-sent late ran past the front door's own bound (its timeout and a 10 s grace) and failed with a 503
where it should have ended at its timeout with what it generated. Stand-in replicas (tests/cluster/stand_in.py)."""

from __future__ import annotations

import threading
import time
import types
from typing import Any

import pytest

from tests.cluster.stand_in import RayActorError, install

DIED_AFTER_S = 0.3  # replica 0 dies this long after taking the request


def test_a_resent_generate_tells_its_replica_the_seconds_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None, call_timeout=30.0)
    sent: list[tuple[Any, ...]] = []

    def dies(*_: Any) -> BaseException:
        time.sleep(DIED_AFTER_S)
        return RayActorError("the actor died")  # ray.get raises it: a dead replica

    def answers(*args: Any) -> str:
        sent.append(args)
        return "done on 1"

    cluster.actor(0)._generate = dies
    cluster.actor(1)._generate = answers
    try:
        assert cluster.generate([1, 2, 3], 2, timeout=5.0) == "done on 1"  # round robin: replica 0 first
        assert len(sent) == 1 and len(sent[0]) == 5, sent
        assert sent[0][4] >= DIED_AFTER_S  # the seconds spent before the re-send, counted against its timeout
    finally:
        cluster.close()


def test_the_replica_shortens_a_generate_deadline_by_the_seconds_spent() -> None:
    from radixcache.runtime.cluster.replica import EngineReplica

    request = types.SimpleNamespace(deadline=100.0, queue_deadline=None)
    handle = types.SimpleNamespace(request=request, result=lambda: "result", cancel=lambda: None)
    replica = object.__new__(EngineReplica)  # no engine to build: a stand-in's submit
    replica.engine = types.SimpleNamespace(submit=lambda *a, **k: handle)
    replica._handles, replica._early_cancels, replica._cancel_lock = {}, {}, threading.Lock()
    assert replica.generate([1, 2], 2, {"timeout": 10.0}, "g1", 4.0) == "result"
    assert request.deadline == pytest.approx(96.0)  # as one engine's: counted from when the front door took it
