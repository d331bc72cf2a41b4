"""ReplicaCluster.generate (the Python API's blocking call) honours the request's `timeout` behind a frozen replica
(alive, answering nothing), as the streaming path does: its replica ends it at its timeout, a frozen one ends
nothing, and the call waited the whole `call_timeout`. Past its timeout and a grace it is cancelled on its replica
and fails with ReplicaUnavailableError (503). Stand-in replicas (tests/cluster/stand_in.py): replica 0 never
answers."""

from __future__ import annotations

import pytest

from radixcache.runtime.engine.errors import ReplicaUnavailableError
from tests.cluster.stand_in import freeze_generate, install

CALL_TIMEOUT_S = 20.0  # what the call waited without the fix (then failing with another message)


def test_a_generate_on_a_frozen_replica_fails_at_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster import stream_wait
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    monkeypatch.setattr(stream_wait, "TIMEOUT_GRACE_S", 0.1)
    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None, call_timeout=CALL_TIMEOUT_S)
    frozen = cluster.actor(0)
    names, never = freeze_generate(frozen)
    synced: list[int] = []
    sync = cluster.sync
    monkeypatch.setattr(cluster, "sync", lambda replica, *wait: synced.append(replica) or sync(replica, *wait))
    try:
        with pytest.raises(ReplicaUnavailableError, match="did not end request"):
            cluster.generate([1, 2, 3], 2, timeout=0.1)  # round robin: replica 0
        assert len(names) == 1 and frozen.cancels == [names[0][0]]  # cancelled there, once, by its name
        assert synced == []  # its exit asks the frozen replica for nothing more
        assert cluster.generate([1, 2, 3], 2, timeout=0.1) == "done on 1"  # a replica that answers is not cut
        assert cluster.actor(1).cancels == [] and cluster.loads.in_flight() == 0 and cluster.alive == (0, 1)
    finally:
        never.set_result(None)
        cluster.close()
