"""A request its replica refused (a full queue: QueueFullError, 429) computed nothing there, so the front door asks
that replica for no cache events on its way out: it did so whenever no queue timeout was set (its flag for "admitted"
was the queue timeout's deadline flag, true from the start without one), so under overload each 429 waited for an
event round trip behind the others' (one per replica at a time), the k-th after k of them. Stand-in replicas
(tests/cluster/stand_in.py), whose event pulls are counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime.engine.errors import QueueFullError
from tests.cluster.stand_in import RayTaskError, echo_script, install


@pytest.mark.parametrize("queue_timeout", [None, 30.0])
def test_a_refused_request_asks_its_replica_for_no_events(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path, queue_timeout: float | None
) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster("fake", 1, poll_interval=None, engine_kwargs={"queue_timeout": queue_timeout})
    engine = ClusterEngine(cluster, str(tiny_dir))
    actor = cluster.actor(0)
    pulls: list[int] = []
    events = actor._events_since
    actor._events_since = lambda seq: pulls.append(seq) or events(seq)
    try:
        actor.script = lambda _p, _o: [RayTaskError(QueueFullError("the queue is full", retry_after=2.0))]
        for i in range(3):
            with pytest.raises(QueueFullError):
                engine.submit([1, 2, i], 2).result(timeout=10)
        assert pulls == []
        served: Any = echo_script  # a request the replica admitted and ran: its pages are synced on its way out
        actor.script = lambda p, o: [("admitted", None, None), *served(p, o)]
        assert engine.submit([1, 2, 3], 2).result(timeout=10).token_ids == (3, 3)
        assert len(pulls) == 1
    finally:
        engine.close()
