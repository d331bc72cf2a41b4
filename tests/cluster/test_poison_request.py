"""A request that kills its replica (a native crash, an OOM kill) is re-sent at most once: before, it was re-sent to
each live replica in turn and took every one of them down. Without Ray: the stand-in's replicas die under it on
demand (tests/cluster/stand_in.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixcache.runtime.engine.errors import EngineDeadError, ReplicaUnavailableError
from tests.cluster.stand_in import RayActorError, RayTaskError, install


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


def _dead(actor: object) -> None:
    """A replica whose process died before the request came: every call to it fails, its `check_alive` (the front
    door's check before a re-send) and `info` too."""
    for method in ("info", "check_alive", "generate"):
        actor.fail[method] = RayActorError("the actor died")  # type: ignore[attr-defined]
    actor.script = _poison  # type: ignore[attr-defined]


def test_a_request_sent_after_every_replica_died_is_told_none_is_live(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    """Every replica died before the request came, unseen by the front door (its Ray reading:
    test_dead_before_request_ray.py): it said "engine replicas 0, 1 died while serving this request; ... it may be
    what kills them". The first one's death is seen under the request; the other is found dead before a re-send."""
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    for call in ("stream", "generate"):
        cluster = ReplicaCluster("fake", 3, router="round_robin", poll_interval=None, call_timeout=5.0)
        front = ClusterEngine(cluster, str(tiny_dir))
        try:
            for r in range(3):
                _dead(cluster.actor(r))
            with pytest.raises(ReplicaUnavailableError, match="no live engine replica") as failed:
                front.generate([5, 6, 7], 2) if call == "stream" else cluster.generate([5, 6, 7], 2)
            assert "died while serving" not in str(failed.value) and "kills" not in str(failed.value)
            assert sum(len(cluster.actor(r).streams) for r in range(3)) == (call == "stream")  # sent to one only
            assert cluster.alive == () and cluster.stats().deaths == 3 and cluster.loads.in_flight() == 0
        finally:
            front.close()


def test_a_death_seen_before_the_request_was_sent_there_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica the front door saw die (another request's failed call, the poller) between this request's routing
    and its send: the request did not kill it, and a second one so does not stop it either."""
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    cluster = ReplicaCluster("fake", 3, router="round_robin", poll_interval=None, call_timeout=5.0)
    try:
        dispatch, routed = cluster.dispatch, []

        def routed_then_seen_dead(request: object, tried: set[int]) -> tuple[int, int]:
            replica, rid = dispatch(request, tried)  # type: ignore[arg-type]
            routed.append(replica)
            if len(routed) < 3:  # found dead by another call before this one is sent
                cluster.actor(replica).fail["generate"] = RayActorError("the actor died")
                cluster.mark_dead(replica, RayActorError("seen dead by another call"))
            return replica, rid

        monkeypatch.setattr(cluster, "dispatch", routed_then_seen_dead)
        assert cluster.generate([1, 2, 3], 2) == f"done on {routed[-1]}"  # neither death was its: re-sent twice
        assert sorted(routed) == [0, 1, 2] and cluster.alive == (routed[-1],)
        assert cluster.stats().deaths == 2 and cluster.stats().retries == 2
    finally:
        cluster.close()


def test_a_poison_request_is_stopped_although_the_others_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check before a re-send finds the replica the request goes to next alive; the request kills it there:
    that death is seen after it was sent, so it counts, and the third replica never gets it."""
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    cluster = ReplicaCluster("fake", 3, router="round_robin", poll_interval=None, call_timeout=5.0)
    try:
        for r in range(3):
            cluster.actor(r).fail["generate"] = RayActorError("the actor died")  # only under a request: info answers
        with pytest.raises(ReplicaUnavailableError, match="not re-sent again"):
            cluster.generate([1, 2, 3], 2)
        assert len(cluster.alive) == 1 and cluster.stats().deaths == 2 and cluster.stats().retries == 1
    finally:
        cluster.close()


def _loop_dead(actor: object) -> None:
    """A replica whose process lives but whose engine loop died: its `info` answers; every request, and its
    `check_alive`, gets EngineDeadError (in Ray's wrapper)."""
    dead = RayTaskError(EngineDeadError(RuntimeError("the loop broke")))
    actor.fail["generate"] = actor.fail["check_alive"] = dead  # type: ignore[attr-defined]
    actor.script = lambda prompt, options: [dead]  # type: ignore[attr-defined]


@pytest.mark.parametrize("replicas", [2, 3])
def test_a_replica_whose_engine_loop_died_is_found_before_a_re_send(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path, replicas: int
) -> None:
    """Replica 0 died before the request came, unseen; replica 1's engine loop had died (its process lives, so its
    `info` answered the check before the re-send): the request, re-sent there, got EngineDeadError and was told
    "engine replicas 0, 1 died while serving this request; ... it may be what kills them". Now the check finds its
    loop dead: it leaves the routing set (ended for Ray to restart) before the re-send, which goes to a live one (the
    third) or, with none, is told that no live replica can take it."""
    ray = install(monkeypatch)
    killed: list[object] = []
    ray.kill = lambda actor, no_restart=True: killed.append(actor)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    for call in ("stream", "generate"):
        cluster = ReplicaCluster("fake", replicas, router="round_robin", poll_interval=None, call_timeout=5.0)
        front = ClusterEngine(cluster, str(tiny_dir))
        try:
            _dead(cluster.actor(0))
            _loop_dead(cluster.actor(1))
            run = front.generate if call == "stream" else cluster.generate
            if replicas == 2:
                with pytest.raises(ReplicaUnavailableError, match="no live engine replica") as failed:
                    run([5, 6, 7], 2)
                assert "died while serving" not in str(failed.value) and "kills" not in str(failed.value)
            else:
                answer = run([5, 6, 7], 2)
                assert answer == "done on 2" if call == "generate" else answer.token_ids == (7, 7), answer
            assert not cluster.actor(1).streams  # never sent to the replica whose loop had died
            assert cluster.actor(1) in killed  # ended for Ray to restart, as when a request finds its loop dead
            assert cluster.alive == tuple(range(2, replicas)) and cluster.stats().deaths == 2
            assert cluster.loads.in_flight() == 0
        finally:
            front.close()
        killed.clear()
