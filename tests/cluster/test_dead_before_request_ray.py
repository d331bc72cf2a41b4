"""A request that arrives after every replica died (each killed for good, before the front door noticed) found them
dead: it did not kill them. Its 503 said "engine replicas 0, 1 died while serving this request; ... it may be what
kills them". It now says that no live engine replica is left. A real local Ray cluster, the tiny checkpoint."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from radixcache.runtime.cluster.cluster import ReplicaCluster  # noqa: E402
from radixcache.runtime.engine.errors import ReplicaUnavailableError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one Ray cluster at a time


def _dead(cluster: ReplicaCluster, replica: int) -> bool:
    info = ray._private.state.actors(actor_id=cluster.actor(replica)._actor_id.hex())
    return info["State"] == "DEAD"


def test_a_request_sent_after_every_replica_died_is_not_blamed(local_ray: str, tiny_dir: Path) -> None:
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster(str(tiny_dir), 2, engine_kwargs={"capacity_blocks": 32}, poll_interval=None, threads=1)
    engine = ClusterEngine(cluster, str(tiny_dir))
    try:
        before = time.time()
        for replica in (0, 1):
            ray.kill(cluster.actor(replica), no_restart=True)
        deadline = time.monotonic() + 30
        while not (_dead(cluster, 0) and _dead(cluster, 1)):
            assert time.monotonic() < deadline, "Ray did not record the kills"
            time.sleep(0.05)
        assert cluster.alive == (0, 1)  # the front door has not noticed: the request finds them
        assert cluster.died_before(0, time.time()) and not cluster.died_before(0, before)
        with pytest.raises(ReplicaUnavailableError) as failed:
            engine.generate([1, 2, 3], 4)
        message = str(failed.value)
        assert "no live engine replica" in message and "died while serving" not in message, message
        assert cluster.alive == () and cluster.stats().deaths == 2 and cluster.loads.in_flight() == 0
    finally:
        engine.close()
