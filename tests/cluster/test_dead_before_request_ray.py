"""Which replica deaths count against a request's re-send limit (runtime.cluster.resend), on a real local Ray cluster
with the tiny checkpoint: only those the front door first saw after the request was sent there.

- A request that arrives after every replica died (each killed for good, before the front door noticed) found them
  dead: it did not kill them. Its 503 said "engine replicas 0, 1 died while serving this request; ... it may be what
  kills them"; it now says that no live engine replica can take it.
- A request that kills each replica it reaches (its process killed at once, as a native crash or the OOM killer
  does) is still stopped after two: a fix that read each death's time from Ray's actor table let it through, as Ray's
  recorded end time can come before the kill that caused it; the front door's own record needs no clock of Ray's.
- A request whose replica died, re-sent to a replica whose engine loop had died (its process alive, its `info`
  answering the check before the re-send), was told it "may be what kills them"; the check asks `check_alive` now.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from radixcache.runtime.cluster.cluster import ReplicaCluster  # noqa: E402
from radixcache.runtime.engine.errors import EngineDeadError, ReplicaUnavailableError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one Ray cluster at a time (conftest.py)
ENGINE = {"capacity_blocks": 32}
POISON = [7, 7, 7, 7, 7]


def _gone(actor: Any) -> bool:
    """Whether `actor` fails a call as a dead actor (asked here, not through the front door, which sees nothing)."""
    try:
        ray.get(actor.info.remote(), timeout=5)
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
        return True
    return False


def test_a_request_sent_after_every_replica_died_is_told_none_is_live(local_ray: str, tiny_dir: Path) -> None:
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster(str(tiny_dir), 2, engine_kwargs=ENGINE, cpus=0.5, poll_interval=None)
    engine = ClusterEngine(cluster, str(tiny_dir))
    try:
        for replica in (0, 1):
            ray.kill(cluster.actor(replica), no_restart=True)
        deadline = time.monotonic() + 60
        while not (_gone(cluster.actor(0)) and _gone(cluster.actor(1))):
            assert time.monotonic() < deadline, "Ray did not end the killed replicas"
            time.sleep(0.05)
        assert cluster.alive == (0, 1)  # the front door has not seen them die: the request finds them so
        with pytest.raises(ReplicaUnavailableError) as failed:
            engine.generate([1, 2, 3], 4)
        message = str(failed.value)
        assert "no live engine replica" in message and "died while serving" not in message, message
        assert "kills" not in message, message
        assert cluster.alive == () and cluster.stats().deaths == 2 and cluster.loads.in_flight() == 0
    finally:
        engine.close()


def test_a_request_that_kills_each_replica_it_reaches_is_stopped_after_two(
    local_ray: str, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixcache.runtime.cluster import cluster as cluster_module
    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.cluster.replica import EngineReplica

    class KilledByPoison(EngineReplica):  # a local class: Ray ships it by value to the replicas' processes
        def stream(self, rid: str, prompt: Any, *args: Any) -> Any:
            if list(prompt) == POISON:  # its process ends at once, before it can send anything
                os.kill(os.getpid(), signal.SIGKILL)
            yield from super().stream(rid, prompt, *args)

    monkeypatch.setattr(cluster_module, "EngineReplica", KilledByPoison)
    cluster = ReplicaCluster(str(tiny_dir), 3, engine_kwargs=ENGINE, cpus=0.5, poll_interval=None)
    engine = ClusterEngine(cluster, str(tiny_dir))
    try:
        assert engine.generate([1, 2, 3], 2).finish_reason in ("length", "stop")  # they serve other prompts
        with pytest.raises(ReplicaUnavailableError, match="died while serving this request; it is not re-sent"):
            engine.generate(POISON, 2)
        stats = cluster.stats()
        assert len(cluster.alive) == 1 and stats.deaths == 2 and stats.retries == 1, stats  # the third never got it
        assert engine.generate([1, 2, 3], 2).finish_reason in ("length", "stop")  # the one it never reached
        assert cluster.loads.in_flight() == 0
    finally:
        engine.close()


# Extended tier (tests/conftest.py): the default run holds it more cheaply: the same sequence on the real replica
# class and real engines in this process (test_loop_dead_before_resend.py), on stand-ins
# (test_poison_request.py::test_a_replica_whose_engine_loop_died_is_found_before_a_re_send), and Ray's own report
# of replicas killed before the request came (the first test above). 17.6 s of the last full run.
@pytest.mark.extended
def test_a_replica_whose_engine_loop_died_is_found_before_the_re_send(
    local_ray: str, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica 1's engine loop died (its process lives, so its `info` answers); replica 0 was killed before the
    request came. The request, failing on 0, was re-sent to 1 and told it "may be what kills them"; the check before
    the re-send now asks `check_alive` (on the replica's control threads) and finds 1's loop dead."""
    from radixcache.runtime.cluster import cluster as cluster_module
    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.cluster.replica import EngineReplica

    class LoopBreaks(EngineReplica):  # a local class: Ray ships it by value to the replicas' processes
        def break_loop(self) -> bool:
            def broken(_done: Any) -> None:  # a bug in the loop itself, outside every per-request guard
                raise RuntimeError("the loop broke")

            loop = self.engine._loop
            loop._deliver = broken
            with contextlib.suppress(EngineDeadError):  # the request that met the bug
                self.engine.generate([1, 2, 3], 1)
            deadline = time.monotonic() + 30
            while loop.dead is None and time.monotonic() < deadline:
                time.sleep(0.01)
            return loop.dead is not None

    monkeypatch.setattr(cluster_module, "EngineReplica", LoopBreaks)
    cluster = ReplicaCluster(str(tiny_dir), 2, engine_kwargs=ENGINE, cpus=0.5, poll_interval=None)
    engine = ClusterEngine(cluster, str(tiny_dir))
    try:
        assert ray.get(cluster.actor(1).break_loop.remote(), timeout=60)
        assert not _gone(cluster.actor(1))  # its process lives: info answers
        ray.kill(cluster.actor(0), no_restart=True)
        deadline = time.monotonic() + 60
        while not _gone(cluster.actor(0)):
            assert time.monotonic() < deadline, "Ray did not end the killed replica"
            time.sleep(0.05)
        assert cluster.alive == (0, 1)
        with pytest.raises(ReplicaUnavailableError) as failed:
            engine.generate([5, 6, 7], 2)
        message = str(failed.value)
        assert "no live engine replica" in message and "kills" not in message, message
        assert cluster.alive == () and cluster.stats().deaths == 2 and cluster.loads.in_flight() == 0
    finally:
        engine.close()
