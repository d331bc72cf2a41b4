"""Engine replicas on a real local Ray cluster (no mocks), with the tiny checkpoint: routing follows the index that
the replicas' events keep; a receiver that missed batches resyncs; and a replica killed while requests run is
dropped at once, its requests finish on the other replica, and it comes back (restarted by Ray) with an empty
index."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from radixcache.runtime.cluster.cluster import ReplicaCluster  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one Ray cluster at a time
PAGE = 4
ENGINE = {"capacity_blocks": 96, "page_size": PAGE}


# local_ray and tiny_dir: tests/cluster/conftest.py (one Ray cluster and one checkpoint for the Ray tests here)


def _wait(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _prompts(seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    return [rng.randrange(1, 250) for _ in range(40)], [rng.randrange(1, 250) for _ in range(40)]


def test_routing_follows_the_index_that_events_keep(local_ray: str, tiny_dir: Path) -> None:
    system_a, system_b = _prompts(1)
    with ReplicaCluster(str(tiny_dir), 2, engine_kwargs=ENGINE, poll_interval=None) as cluster:
        first_a = cluster.generate([*system_a, 7, 8, 9], 3)
        first_b = cluster.generate([*system_b, 7, 8, 9], 3)
        assert first_a.cached_tokens == first_b.cached_tokens == 0
        cluster.poll()  # the events arrive: each system prompt's pages are in one replica's index
        keys_a, keys_b = cluster.page_keys(system_a), cluster.page_keys(system_b)
        holders_a = [r for r in cluster.alive if cluster.index.matched_pages(r, keys_a) == len(keys_a)]
        holders_b = [r for r in cluster.alive if cluster.index.matched_pages(r, keys_b) == len(keys_b)]
        assert len(holders_a) == len(holders_b) == 1 and holders_a != holders_b  # spread, then indexed
        for turn in range(3):  # later turns go where their prefix is, and hit it
            for system in (system_a, system_b):
                result = cluster.generate([*system, 11, 12, turn], 3)
                assert result.cached_tokens >= len(system) // PAGE * PAGE
            cluster.poll()
        routed = cluster.stats().routed
        assert sorted(routed.values()) == [4, 4]
        # A request its replica's engine refuses raises that engine's own error, as Engine.generate's: Ray's wrapper
        # (RayTaskError(ValueError)) read as a remote traceback with terminal colour codes.
        with pytest.raises(ValueError) as refused:
            cluster.generate([1, 10**6], 2)
        assert type(refused.value) is ValueError
        assert str(refused.value) == "token id 1000000 is outside the vocabulary [0, 260)"


def test_a_missed_event_sequence_triggers_a_resync(local_ray: str, tiny_dir: Path) -> None:
    system_a, _ = _prompts(2)
    with ReplicaCluster(str(tiny_dir), 1, engine_kwargs=ENGINE, poll_interval=None) as cluster:
        actor = cluster.actor(0)
        ray.get(actor.set_events_history.remote(1))
        cluster.generate(system_a, 2)
        cluster.poll()
        assert cluster.stats().resyncs == 0
        for i in range(3):  # requests and batches the front door never sees: another caller, another reader
            ray.get(actor.generate.remote([*system_a, *[50 + i] * 8], 2, {}))  # two new pages each
            ray.get(actor.events_since.remote(10**9))
        cluster.poll()  # its last batch is older than the replica's history: a gap
        stats = cluster.stats()
        assert stats.resyncs == 1
        _, seq, keys = ray.get(actor.snapshot.remote())
        assert cluster.index.keys(0) == keys and cluster.index.last_seq(0) == seq


def test_a_killed_replica_is_dropped_and_restarted_with_no_hung_request(local_ray: str, tiny_dir: Path) -> None:
    system_a, system_b = _prompts(3)
    with ReplicaCluster(str(tiny_dir), 2, engine_kwargs=ENGINE, poll_interval=0.05) as cluster:
        cluster.generate(system_a, 2)
        cluster.generate(system_b, 2)
        results: list[object] = []
        errors: list[BaseException] = []

        def client(i: int) -> None:
            try:
                prompt = (system_a if i % 2 else system_b) + [i, i + 1]
                # Long enough to be cut off: the kill lands once 2 are running on the victim, before their tokens
                # (a stream that has sent tokens, in the test below, had ~15 of them when the kill landed).
                results.append(cluster.generate(prompt, 120, ignore_eos=True))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        victim = 0
        _wait(lambda: cluster.loads.running(victim) >= 2)  # requests are in flight on the victim
        ray.kill(cluster.actor(victim), no_restart=False)  # Ray restarts it
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a request hung"
        assert not errors and len(results) == 8  # the dead replica's requests ran again on the other one
        _wait(lambda: cluster.stats().deaths == 1)
        _wait(lambda: cluster.alive == (0, 1))  # back, with an index that starts empty
        assert cluster.index.pages(victim) == 0 and cluster.stats().retries >= 1
        again = cluster.generate([*system_a, 99], 2)
        assert again.token_ids


def test_streams_through_the_front_door_survive_a_killed_replica(local_ray: str, tiny_dir: Path) -> None:
    """The server's path (ClusterEngine: streamed tokens over Ray): a request cut off before its first token is
    re-sent to the other replica; one cut off after it fails with ReplicaUnavailableError; none hangs."""
    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.engine.errors import ReplicaUnavailableError

    system_a, system_b = _prompts(4)
    # Streams far longer than the kill takes: the victim's had sent ~15 tokens when it landed (measured, busy
    # 2-core machine), and whatever outlives the kill checks the same outcomes; 300 tokens cost ~3 s more CPU.
    tokens = 120
    cluster = ReplicaCluster(str(tiny_dir), 2, engine_kwargs=ENGINE, poll_interval=0.05)
    engine = ClusterEngine(cluster, str(tiny_dir))
    try:
        seen: list[int] = []
        handles = []
        for i in range(8):
            handle = engine.submit((system_a if i % 2 else system_b) + [i], tokens, ignore_eos=True)
            handle.request.listener = lambda r: seen.append(len(r.output_ids))
            handles.append(handle)
        # A stream on the victim has sent tokens and is not done: its cut-off is the 503 case. (Waiting for any
        # token at all raced: the tokens could be the other replica's, and the victim's streams then all retried.)
        _wait(lambda: any(h.request.replica == 0 and h.request.output_ids and not h.done() for h in handles))
        ray.kill(cluster.actor(0), no_restart=False)
        outcomes = []
        for handle in handles:
            try:
                result = handle.result(timeout=120)
                outcomes.append("done")
                assert len(result.token_ids) == tokens
                assert list(result.token_ids[: len(handle.request.output_ids)]) == handle.request.output_ids
            except ReplicaUnavailableError:
                outcomes.append("503")
                assert handle.request.replica == 0 and handle.request.output_ids  # it had sent tokens
        assert "503" in outcomes and outcomes.count("done") >= 4, outcomes
        _wait(lambda: cluster.stats().deaths == 1)
        assert engine.generate([*system_a, 5], 3).token_ids  # the survivor (and soon the restarted one) serve on
    finally:
        engine.close()


def test_a_session_sticks_to_its_replica_through_the_front_door(local_ray: str, tiny_dir: Path) -> None:
    """Two unrelated prompts of one session go to one replica; without the session the idle replicas alternate."""
    from radixcache.runtime.cluster.front import ClusterEngine

    system_a, system_b = _prompts(5)
    cluster = ReplicaCluster(str(tiny_dir), 2, engine_kwargs=ENGINE, poll_interval=None)
    engine = ClusterEngine(cluster, str(tiny_dir))
    try:
        first = engine.submit(system_a, 2, session="tenant|user-1")
        first.result(timeout=60)
        second = engine.submit(system_b, 2, session="tenant|user-1")
        second.result(timeout=60)
        assert first.request.replica == second.request.replica  # sticky: nothing cached of B anywhere
        third = engine.submit([*system_b, 1, 2, 3, 4], 2)  # no session: follows B's pages, on the same replica
        third.result(timeout=60)
        fourth = engine.submit([9, 9, 9, 9, *system_a[:8]], 2)  # no session, nothing cached: the other replica
        fourth.result(timeout=60)
        assert fourth.request.replica != first.request.replica
    finally:
        engine.close()


def test_a_saturated_replica_refuses_within_its_queue_limits(local_ray: str, tiny_dir: Path) -> None:
    """Regression: replica actors took 64 calls, so a 65th waited in Ray's queue outside the engine's
    queue_timeout and failed a second later. Now every request reaches the engine's admission, whose timeout counts
    from the front door; errors relayed from the replica keep their type (the server's 503 / 429 / 400)."""
    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.engine.errors import QueueTimeoutError, RequestTooLargeError
    from radixcache.runtime.server.errors import api_error_for

    timeout = 1.0
    kwargs = {**ENGINE, "max_running": 1, "queue_timeout": timeout}
    engine = ClusterEngine(ReplicaCluster(str(tiny_dir), 1, engine_kwargs=kwargs), str(tiny_dir))
    try:
        handles = [engine.submit([1, 2, 3, i], 400, ignore_eos=True) for i in range(70)]
        ended: dict[int, float] = {}
        for i, handle in enumerate(handles):
            handle.future.add_done_callback(lambda _f, i=i: ended.setdefault(i, time.monotonic()))
        late = []
        for i, handle in enumerate(handles):
            try:
                handle.result(timeout=60)
            except QueueTimeoutError:
                late.append(ended[i] - handle.sent_at)
        assert len(late) > 6 and max(late) < timeout + 0.6, sorted(late)[-5:]
        assert api_error_for(QueueTimeoutError("x")).status == 503
        with pytest.raises((RequestTooLargeError, ValueError)) as too_large:  # past the cache, or max_position
            engine.generate([i % 250 + 1 for i in range(1000)], 2)
        assert api_error_for(too_large.value).status == 400, too_large.value
    finally:
        engine.close()
    # A replica whose queue is full (max_queue 0) refuses with QueueFullError, status 429: in
    # test_serve_over_replicas_answers_429_400_and_503_over_http, on the same replica that serves its HTTP checks.


def test_serve_over_replicas_answers_429_400_and_503_over_http(local_ray: str, tiny_dir: Path) -> None:
    """A replica whose queue is full (max_queue 0): the front door's call raises the QueueFullError relayed from
    the replica, with its retry estimate (status 429). Then the OpenAI app over that front door: a full queue is
    429 with Retry-After, a prompt its pool can never hold 400, and once the replica is gone for good (killed, not
    restarted) 503 `replica_unavailable`; never a 500."""
    from fastapi.testclient import TestClient

    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.engine.errors import QueueFullError
    from radixcache.runtime.server import create_app
    from radixcache.runtime.server.errors import api_error_for

    cluster = ReplicaCluster(str(tiny_dir), 1, engine_kwargs={**ENGINE, "max_queue": 0}, poll_interval=None)
    engine = ClusterEngine(cluster, str(tiny_dir))
    body = {"model": "tiny", "prompt": [1, 2, 3, 4], "max_tokens": 2}
    try:
        with pytest.raises(QueueFullError) as refused:
            engine.generate([1, 2, 3], 2)
        error = api_error_for(refused.value)  # the exception relayed from the replica, with its retry estimate
        assert error.status == 429 and int(error.headers["Retry-After"]) >= 1
        with TestClient(create_app(engine, "tiny")) as client:
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
            assert int(r.headers["retry-after"]) >= 1
            r = client.post("/v1/completions", json={**body, "prompt": [i % 250 + 1 for i in range(1000)]})
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
            ray.kill(cluster.actor(0), no_restart=True)
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 503 and r.json()["error"]["code"] == "replica_unavailable", r.text
            assert int(r.headers["retry-after"]) >= 1
    finally:
        engine.close()


def test_a_cancel_reaches_a_replica_whose_threads_all_hold_streams(local_ray: str, tiny_dir: Path) -> None:
    """Regression: cancels and event pulls ran in the actor's one thread pool, so once every thread held a stream
    (max_running 1 and no max_queue: 73 threads) a cancel waited in Ray's queue behind the streams waiting for a
    thread, and the running request it aimed at ran to its length. Now they run in the actor's control group."""
    from radixcache.runtime.cluster.cluster import actor_threads
    from radixcache.runtime.cluster.front import ClusterEngine

    kwargs = {**ENGINE, "capacity_blocks": 1100, "max_running": 1}
    engine = ClusterEngine(ReplicaCluster(str(tiny_dir), 1, engine_kwargs=kwargs), str(tiny_dir))
    try:
        victim = engine.submit([1, 2, 3], 4000, ignore_eos=True)
        _wait(lambda: bool(victim.request.output_ids))
        waiting = [
            engine.submit([5, 6, i + 1], 2, ignore_eos=True) for i in range(actor_threads(kwargs) + 4)
        ]  # past the threads
        # the streams reach the actor: its threads are all taken, the victim's and one per waiting request the
        # engine holds (asked on the control threads, as the cancel below goes)
        _wait(lambda: engine.check()["waiting"] >= actor_threads(kwargs) - 1)
        # one more waits in Ray's queue past its whole timeout: it ends "timeout" with nothing (the front door holds
        # its timeout; its replica would have counted it only from when a thread took it)
        late = engine.submit([7, 8, 9], 2, timeout=0.5, ignore_eos=True)
        result = late.result(timeout=60)
        assert (result.finish_reason, result.token_ids) == ("timeout", ())
        assert not victim.done()
        victim.cancel()
        result = victim.result(timeout=60)
        assert result.finish_reason == "cancelled" and len(result.token_ids) < 4000
        for handle in waiting:
            assert len(handle.result(timeout=60).token_ids) == 2
        assert engine.check()["running"] == 0
    finally:
        engine.close()


def test_an_engine_option_a_replica_refuses_is_raised_as_itself(local_ray: str, tiny_dir: Path) -> None:
    """Regression: a replica whose engine could not be built (a KV budget under one page) died in its constructor,
    and the front door got Ray's ActorDiedError, whose text is a traceback: `serve --replicas` printed "internal
    error: ActorDiedError ...". Now the engine's own ValueError is raised, and the replicas are ended."""
    with pytest.raises(ValueError, match="smaller than one page") as refused:
        ReplicaCluster(str(tiny_dir), 2, engine_kwargs={"page_size": 16, "kv_memory": "1KiB"})
    assert type(refused.value) is ValueError
    _wait(lambda: ray.available_resources().get("CPU", 0) == 2)  # both actors' CPUs are free again


def test_more_replicas_than_the_cluster_has_cpus_are_refused_at_once(local_ray: str, tiny_dir: Path) -> None:
    """Regression: three replicas of one CPU each on this 2-CPU cluster waited for ever for the third, silently."""
    with pytest.raises(ValueError, match="3 engine replicas of 1 CPUs each need 3 CPUs, and the Ray cluster has 2"):
        ReplicaCluster(str(tiny_dir), 3, engine_kwargs=ENGINE, cpus=1.0, poll_interval=None)
    assert ray.available_resources().get("CPU") == 2.0  # no replica was started


# Extended tier (tests/conftest.py): the default run holds each part of it more cheaply: EngineDeadError pickles
# (test_replica_engine_dead.py::test_engine_dead_error_survives_pickling), a replica whose engine died is dropped, its
# request re-sent and the replica ended for Ray to restart, rejoining under a new incarnation (the same module's
# test_a_replica_whose_engine_died_is_dropped_and_restarted), and Ray's restart of a killed replica, which rejoins
# (test_a_killed_replica_is_dropped_and_restarted_with_no_hung_request above). 32.4 s of the last full run.
@pytest.mark.extended
def test_a_replica_whose_engine_loop_died_is_restarted_and_rejoins(local_ray: str, tiny_dir: Path) -> None:
    """Regression: EngineDeadError could not be pickled, so a replica whose engine loop died answered every request
    with Ray's UnserializableException (a 500), and stayed in the routing set, idle-looking, drawing requests."""
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster(str(tiny_dir), 2, router="least_loaded", engine_kwargs=ENGINE, poll_interval=0.05)
    front = ClusterEngine(cluster, str(tiny_dir))
    try:
        ray.get(cluster.actor(0).__ray_call__.remote(lambda replica: replica.engine._loop._die(RuntimeError("bug"))))
        results = [front.submit([1, 2, 3 + i], 2).result(timeout=120) for i in range(3)]
        assert all(len(r.token_ids) == 2 for r in results)
        assert cluster.stats().deaths == 1 and cluster.stats().retries == 1
        _wait(lambda: cluster.alive == (0, 1))  # restarted by Ray, a new process: back in the routing set
        assert len(ray.get(cluster.actor(0).generate.remote([4, 5, 6], 2, {})).token_ids) == 2
    finally:
        front.close()
