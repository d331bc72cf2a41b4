"""ReplicaCluster.generate (the Python API's blocking call) that stops waiting for its replica cancels the request
there: past `call_timeout` it raised 503 and released the request's load, but the request ran on on the replica
(to its max_new_tokens, holding its KV and a slot) while the router counted that replica idle. Stand-in replicas
(tests/cluster/stand_in.py): replica 0 never answers the call, and the test reads the cancels it was sent."""

from __future__ import annotations

from typing import Any

import pytest

from radixcache.runtime.engine.errors import ReplicaUnavailableError
from tests.cluster.stand_in import freeze_generate, install


def test_a_generate_past_call_timeout_is_cancelled_on_its_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None, call_timeout=0.2)
    frozen = cluster.actor(0)
    names, never = freeze_generate(frozen)
    try:
        with pytest.raises(ReplicaUnavailableError, match=r"did not answer within 0\.2 s"):
            cluster.generate([1, 2, 3], 2)  # round robin: replica 0
        assert len(names) == 1 and len(names[0]) == 2, "the replica got no name to cancel the request by"  # and elapsed
        assert frozen.cancels == [names[0][0]]
        assert cluster.generate([1, 2, 3], 2) == "done on 1"  # the next one, on replica 1, is not cancelled
        assert cluster.actor(1).cancels == [] and cluster.loads.in_flight() == 0 and cluster.alive == (0, 1)
    finally:
        never.set_result(None)
        cluster.close()


def test_a_warm_up_past_call_timeout_is_cancelled_and_a_503(monkeypatch: pytest.MonkeyPatch, tiny_dir: Any) -> None:
    """The replay's warm-up (ClusterEngine.warm_up) on a frozen replica raised Ray's own GetTimeoutError, and its
    request ran on there."""
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None, call_timeout=0.2)
    engine = ClusterEngine(cluster, str(tiny_dir))
    names, never = freeze_generate(cluster.actor(1))
    try:
        with pytest.raises(ReplicaUnavailableError, match="engine replica 1 did not answer the warm-up"):
            engine.warm_up([1, 2, 3, 4], 2)
        assert len(names) == 1 and len(names[0]) == 1 and cluster.actor(1).cancels == [names[0][0]]
        assert cluster.actor(0).cancels == []  # it answered
    finally:
        never.set_result(None)
        engine.close()
