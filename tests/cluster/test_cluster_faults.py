"""ReplicaCluster's error paths without Ray: the `ray` module is replaced by a stand-in whose actors answer, time
out or die on demand (tests/cluster/stand_in.py). No live replica left is a ReplicaUnavailableError at once (an
HTTP 503); a Ray timeout on an event pull leaves the replica and its index as they were; a call that times out is
a 503, not a hang or a 500; a resync onto an actor that died drops the replica from the routing set; a dead
replica's next call is retried on the other."""

from __future__ import annotations

import time

import pytest

from radixcache.runtime.engine.errors import ReplicaUnavailableError
from radixcache.runtime.server.errors import api_error_for
from tests.cluster.stand_in import GetTimeoutError, RayActorError, install


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch):
    install(monkeypatch)
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


def test_a_replica_that_does_not_answer_a_call_to_every_replica_is_a_503(cluster) -> None:
    """Regression: the calls to every replica (stats for /metrics, check, flush) let a Ray timeout through, so a
    replica that did not answer made /metrics a 500 "internal error: GetTimeoutError"."""
    cluster.actor(0).fail["stats"] = GetTimeoutError("timed out")
    with pytest.raises(ReplicaUnavailableError, match="replica 0 did not answer stats") as exc:
        cluster.replica_stats()
    assert api_error_for(exc.value).status == 503
    assert cluster.alive == (0, 1)  # slow is not dead


def test_per_replica_rows_keep_their_replica_when_one_is_found_dead(cluster, tiny_dir) -> None:
    """Regression: `per_replica` zipped the replicas alive before the stats calls with the answers after them, so a
    dead replica found by those calls shifted the next replica's numbers onto its id (the replay's table)."""
    from radixcache.runtime.cluster.front import ClusterEngine

    engine = ClusterEngine(cluster, str(tiny_dir))
    cluster.actor(0).fail["counted_stats"] = RayActorError("died")
    rows = engine.per_replica()
    assert [(row["replica"], row["prompt_tokens"]) for row in rows] == [(1, 101)]
    assert cluster.alive == (1,)


def test_a_resync_that_times_out_leaves_the_replica_as_it_was(cluster) -> None:
    """Regression: a snapshot call that timed out escaped the resync as GetTimeoutError: from the poller it ended
    the polling thread for good, and from the sync after a request it failed that finished request (a 500)."""
    cluster.actor(0).batches = None  # a gap: the next sync resyncs
    cluster.actor(0).fail["snapshot"] = GetTimeoutError("slow")
    cluster.poll()
    assert cluster.alive == (0, 1) and cluster.stats().resyncs == 0
    assert sorted(cluster.generate([1, 2, 3], 2) for _ in range(2)) == ["done on 0", "done on 1"]
    del cluster.actor(0).fail["snapshot"]
    cluster.poll()
    assert cluster.stats().resyncs == 1


def test_the_poller_survives_a_round_that_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    c = ReplicaCluster("fake", 2, poll_interval=0.01)
    try:
        rounds = []
        real = c.poll

        def flaky(*wait: float) -> None:
            rounds.append(1)
            if len(rounds) == 1:
                raise RuntimeError("a bad round")
            real(*wait)

        monkeypatch.setattr(c, "poll", flaky)
        deadline = time.monotonic() + 5
        while len(rounds) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(rounds) >= 3 and c._poller is not None and c._poller.is_alive()
    finally:
        c.close()


@pytest.mark.parametrize(("replicas", "cpus", "have"), [(3, 1.0, 2.0), (2, 1.5, 2.0), (5, 0.5, 2.0)])
def test_more_replicas_than_the_ray_cluster_can_place_are_refused_before_any_starts(
    monkeypatch: pytest.MonkeyPatch, replicas: int, cpus: float, have: float
) -> None:
    """Regression: ReplicaCluster(model, 3) on a Ray cluster of 2 CPUs (a 2-core machine, each replica 1 CPU) waited
    for ever, silently, for the replica Ray could never place. Real Ray: test_cluster_ray.py."""
    ray = install(monkeypatch)
    ray.cluster_resources = lambda: {"CPU": have}
    started = []
    monkeypatch.setattr(ray, "remote", lambda *a, **k: started.append(1))
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    with pytest.raises(ValueError, match=rf"{replicas} engine replicas of {cpus:g} CPUs each need .* has {have:g}"):
        ReplicaCluster("fake", replicas, cpus=cpus, poll_interval=None)
    assert started == []


@pytest.mark.parametrize(("replicas", "cpus"), [(2, 1.0), (3, 2 / 3), (6, 16 / 6), (7, 16 / 7), (4, 0.0)])
def test_replicas_that_fit_the_ray_cluster_start(monkeypatch: pytest.MonkeyPatch, replicas: int, cpus: float) -> None:
    """The CLI's local share (cores / replicas) fits exactly, as Ray rounds a share down to 1/10,000 of a CPU."""
    ray = install(monkeypatch)
    ray.cluster_resources = lambda: {"CPU": 16.0 if cpus > 1 else 2.0}
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    ReplicaCluster("fake", replicas, cpus=cpus, poll_interval=None).close()


@pytest.mark.parametrize("cpus", [float("nan"), float("inf"), -1.0, "1", True])
def test_a_cpu_share_that_is_no_number_is_refused(monkeypatch: pytest.MonkeyPatch, cpus: object) -> None:
    """Before a local Ray cluster starts (it was checked after ray.init: seconds, and Ray left running)."""
    ray = install(monkeypatch)
    started: list[str] = []
    ray.is_initialized = lambda: False
    ray.init = lambda *_a, **_k: started.append("ray.init")
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    with pytest.raises(ValueError, match=r"cpus .* must be a finite number >= 0"):
        ReplicaCluster("fake", 2, cpus=cpus, poll_interval=None)  # type: ignore[arg-type]
    assert started == []


def test_an_unknown_router_is_refused_before_any_replica_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the router was made after every replica had loaded its model (seconds to minutes), so a typo in
    its name cost the whole start before the RouterError."""
    from radixcache.router import RouterError

    ray = install(monkeypatch)
    started = []
    monkeypatch.setattr(ray, "remote", lambda *a, **k: started.append(1))
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    with pytest.raises(RouterError, match="unknown router 'cache-aware'"):
        ReplicaCluster("fake", 2, router="cache-aware", poll_interval=None)
    assert started == []


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"max_queue": 40_000}, "at most 4096"), ({"max_queue": -100}, "max_queue")]
)
def test_a_queue_no_replica_actor_could_start_is_refused_before_ray(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, int], match: str
) -> None:
    """Regression: a replica's actor gets a thread per request its engine may hold, and Ray starts them all with it:
    `--max-queue 40000` asked for 40,072 (past what a process may map: on a real Ray cluster under a 16 GB
    address-space limit, 5,000 already killed the actor at its start, and Ray restarted it for ever while the start
    waited, silently). A negative one asked for fewer than 1. Both are refused before Ray starts."""
    ray = install(monkeypatch)
    started: list[str] = []
    ray.is_initialized = lambda: False
    ray.init = lambda *_a, **_k: started.append("ray.init")
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    with pytest.raises(ValueError, match=match):
        ReplicaCluster("fake", 2, engine_kwargs=kwargs, poll_interval=None)
    assert started == []


@pytest.mark.parametrize("replicas", [2.0, True, "2", 0])
def test_a_replica_count_that_is_no_int_is_refused_before_ray(
    monkeypatch: pytest.MonkeyPatch, replicas: object
) -> None:
    """Regression: 2.0 passed the `>= 1` check, started a local Ray cluster and failed in range() with a TypeError;
    True made one replica; "2" was a TypeError comparing it."""
    ray = install(monkeypatch)
    started: list[str] = []
    ray.is_initialized = lambda: False
    ray.init = lambda *_a, **_k: started.append("ray.init")
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    with pytest.raises(ValueError, match="replicas must be an int >= 1"):
        ReplicaCluster("fake", replicas, poll_interval=None)  # type: ignore[arg-type]
    assert started == []


def _ray_started_here(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """The stand-in with Ray not running: `ray.init` starts a local cluster of `num_cpus` CPUs, `shutdown` ends it."""
    ray = install(monkeypatch)
    state: dict[str, object] = {"cpus": None, "inits": 0}
    ray.is_initialized = lambda: state["cpus"] is not None

    def init(*_a: object, num_cpus: int | None = None, **_k: object) -> None:
        assert state["cpus"] is None, "ray.init on a running Ray"
        state["cpus"], state["inits"] = float(num_cpus or 64), state["inits"] + 1  # type: ignore[operator]

    ray.init = init
    ray.shutdown = lambda: state.update(cpus=None)
    ray.cluster_resources = lambda: {"CPU": state["cpus"] or 0.0}
    return state


def test_a_start_that_fails_ends_the_ray_it_started_so_a_retry_gets_its_num_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: ReplicaCluster(model, 3, num_cpus=2) failed ("need 3 CPUs, and the Ray cluster has 2: ... start Ray
    with more CPUs (num_cpus=)") and left the local Ray cluster it had started running, so the retry the error
    advised, num_cpus=4, joined that cluster, ignored num_cpus and failed the same way (seen on real Ray 2.60)."""
    state = _ray_started_here(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    with pytest.raises(ValueError, match="need 3 CPUs, and the Ray cluster has 2"):
        ReplicaCluster("fake", 3, num_cpus=2, poll_interval=None)
    assert state["cpus"] is None  # the Ray it started is shut down
    cluster = ReplicaCluster("fake", 3, num_cpus=4, poll_interval=None)
    assert state == {"cpus": 4.0, "inits": 2} and cluster.alive == (0, 1, 2)
    cluster.close()


def test_closing_the_front_door_that_started_ray_leaves_it_to_another_that_joined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two front doors in one process (two models): the first starts the local Ray, the second joins it; closing the
    first must not shut Ray down under the second's replicas."""
    state = _ray_started_here(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    first = ReplicaCluster("fake", 1, num_cpus=4, poll_interval=None)
    second = ReplicaCluster("fake", 1, poll_interval=None)
    assert first.owns_ray and not second.owns_ray
    first.close()
    assert state["cpus"] == 4.0 and second.generate([1, 2, 3], 2)  # its replica still answers
    second.close()


def test_a_replica_that_fails_its_start_ends_the_ray_the_start_began(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica's process that dies while it starts (runtime.cluster.placement.wait_started) fails the start, which
    ends the local Ray cluster it began, as a refused CPU count does."""
    state = _ray_started_here(monkeypatch)
    from radixcache.runtime.cluster import cluster as cluster_module

    def died(*_a: object) -> None:
        raise RuntimeError("engine replica 0's process died while it started")

    monkeypatch.setattr(cluster_module, "wait_started", died)
    with pytest.raises(RuntimeError, match="died while it started"):
        cluster_module.ReplicaCluster("fake", 2, poll_interval=None)
    assert state == {"cpus": None, "inits": 1}


def test_close_leaves_running_a_ray_that_ran_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray started before the front door (the tests' shared cluster, a user's ray.init) is not its to end."""
    ray = install(monkeypatch)
    ended: list[str] = []
    ray.shutdown = lambda: ended.append("ray.shutdown")
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    with pytest.raises(ValueError, match="need 90 CPUs"):  # a failed start leaves it running too
        ReplicaCluster("fake", 3, cpus=30.0, poll_interval=None)
    ReplicaCluster("fake", 2, poll_interval=None).close()
    assert ended == []
