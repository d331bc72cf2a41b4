"""A request's `timeout` (the server's --request-timeout) bounds its wait behind a frozen replica too: its replica
ends it at its timeout, but a frozen one (alive, sending nothing) ends nothing, and the front door waited
call_timeout (600 s) for its next item, so `--request-timeout 30` clients waited ten minutes. Past its timeout and
a grace, the front door cancels it there and fails it (503). Stand-in replicas (tests/cluster/stand_in.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixcache.runtime.engine.errors import ReplicaUnavailableError
from tests.cluster.stand_in import install

HANG_S = 30.0  # a bound on a hang, never reached with the fix


def test_a_request_on_a_frozen_replica_fails_at_its_timeout(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster import stream_wait
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    monkeypatch.setattr(stream_wait, "TIMEOUT_GRACE_S", 0.1)
    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None, call_timeout=600.0)
    engine = ClusterEngine(cluster, str(tiny_dir))
    frozen = cluster.actor(0)
    frozen.script = lambda prompt, _options: [("tokens", [prompt[-1]], [None])]  # one token, then silence
    try:
        handle = engine.submit([5, 6, 7], 4, timeout=0.2)  # round robin: replica 0
        with pytest.raises(ReplicaUnavailableError, match="did not end request"):
            handle.result(HANG_S)
        assert frozen.cancels == [handle.rid]
        healthy = engine.submit([5, 6, 8], 4, timeout=0.2)  # replica 1 ends it (the stand-in at once)
        assert healthy.result(HANG_S).token_ids == (8,) * 4
        assert cluster.loads.in_flight() == 0 and cluster.alive == (0, 1)  # slow is not dead
    finally:
        engine.close()
