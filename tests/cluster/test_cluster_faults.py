"""ReplicaCluster's error paths without Ray: the `ray` module is replaced by a stand-in whose actors answer, time
out or die on demand. No live replica left is a ReplicaUnavailableError at once (an HTTP 503); a Ray timeout
on an event pull leaves the replica and its index as they were; a call that times out is a 503, not a hang or a
500; a resync onto an actor that died drops the replica from the routing set; a dead replica's next call is
retried on the other."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from radixcache.runtime.engine.errors import ReplicaUnavailableError
from radixcache.runtime.server.errors import api_error_for


class RayActorError(Exception):
    pass


class ActorUnavailableError(Exception):
    pass


class GetTimeoutError(Exception):
    pass


class _Method:
    def __init__(self, actor: FakeActor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any) -> Any:
        fail = self.actor.fail.get(self.name)
        if fail is not None:
            return fail  # ray.get raises it
        return getattr(self.actor, "_" + self.name)(*args)


class FakeActor:
    """An EngineReplica's answers: `fail[method]` is an exception that method's next ray.get raises."""

    def __init__(self, replica: int, *_: Any) -> None:
        self.replica = replica
        self.fail: dict[str, BaseException] = {}
        self.batches: list | None = []

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    def _info(self) -> dict[str, Any]:
        info = {"fingerprint": "f" * 16, "page_size": 4, "capacity_blocks": 8, "policy": "lru", "model": "fake"}
        return {**info, "incarnation": f"i{self.replica}", "pid": 0}

    def _events_since(self, seq: int) -> tuple[str, list | None]:
        return f"i{self.replica}", self.batches

    def _snapshot(self) -> tuple[str, int, frozenset[bytes]]:
        return f"i{self.replica}", 0, frozenset()

    def _generate(self, prompt: list[int], max_new: int, kwargs: dict[str, Any]) -> str:
        return f"done on {self.replica}"


def _fake_ray() -> types.ModuleType:
    ray = types.ModuleType("ray")
    ray.exceptions = types.SimpleNamespace(  # type: ignore[attr-defined]
        RayActorError=RayActorError, ActorUnavailableError=ActorUnavailableError, GetTimeoutError=GetTimeoutError
    )
    ray.is_initialized = lambda: True  # type: ignore[attr-defined]

    def get(ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, list):
            return [get(r) for r in ref]
        if isinstance(ref, BaseException):
            raise ref
        return ref

    ray.get = get  # type: ignore[attr-defined]
    ray.kill = lambda actor, no_restart=True: None  # type: ignore[attr-defined]
    factory = types.SimpleNamespace(options=lambda **_: types.SimpleNamespace(remote=FakeActor))
    ray.remote = lambda cls: factory  # type: ignore[attr-defined]
    return ray


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "ray", _fake_ray())
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    c = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None, call_timeout=0.5)
    yield c
    c.close()


def test_no_live_replica_left_is_a_503_at_once(cluster) -> None:
    for r in (0, 1):
        cluster.mark_dead(r, RayActorError("gone"))
    with pytest.raises(ReplicaUnavailableError) as exc:
        cluster.generate([1, 2, 3], 2)
    assert api_error_for(exc.value).status == 503
    assert cluster.stats().deaths == 2 and cluster.alive == ()


def test_a_dead_replica_is_dropped_and_the_request_retried_on_the_other(cluster) -> None:
    cluster.actor(0).fail["generate"] = RayActorError("died")
    assert {cluster.generate([1, 2, 3], 2) for _ in range(2)} == {"done on 1"}
    assert cluster.alive == (1,) and cluster.stats().retries == 1


def test_a_call_that_times_out_is_a_503(cluster) -> None:
    for r in (0, 1):
        cluster.actor(r).fail["generate"] = GetTimeoutError("slow")
    with pytest.raises(ReplicaUnavailableError, match="did not answer"):
        cluster.generate([1, 2, 3], 2)
    assert cluster.alive == (0, 1) and cluster.loads.in_flight() == 0  # not dead; its load released


def test_an_event_pull_that_times_out_leaves_the_replica_as_it_was(cluster) -> None:
    cluster.actor(0).fail["events_since"] = GetTimeoutError("slow")
    cluster.poll()
    assert cluster.alive == (0, 1) and cluster.stats().resyncs == 0


def test_a_resync_onto_a_dead_actor_drops_the_replica(cluster) -> None:
    cluster.actor(0).batches = None  # a gap: the batches it needs are no longer kept, so it resyncs
    cluster.actor(0).fail["snapshot"] = RayActorError("died")
    cluster.poll()
    assert cluster.alive == (1,) and cluster.stats().deaths == 1
    del cluster.actor(0).fail["snapshot"]  # back (restarted): the next poll sees it and it rejoins
    cluster.poll()
    assert cluster.alive == (0, 1)


def test_a_replica_actor_has_a_thread_for_every_request_its_engine_may_hold() -> None:
    from radixcache.runtime.cluster.cluster import CONTROL_THREADS, actor_threads
    from radixcache.runtime.engine.scheduler import SchedulerConfig

    assert actor_threads({"max_running": 2, "max_queue": 5}) == 2 + 5 + CONTROL_THREADS
    assert actor_threads({"scheduler_config": SchedulerConfig(max_running=3), "max_queue": 0}) == 3 + CONTROL_THREADS
    assert actor_threads(None) == 64 + 64 + CONTROL_THREADS  # max_queue unbounded: 64 streams past max_running
