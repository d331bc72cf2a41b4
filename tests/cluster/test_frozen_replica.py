"""A replica that stops answering altogether (a frozen process: alive to Ray, answering no call) fails its requests
after `call_timeout` each, all at once: the front door asked it for its cache events on the way out of each failed
request, waiting `call_timeout` again, one request after another behind a per-replica lock (on a real Ray cluster
with a SIGSTOPped replica and call_timeout=3 s, its three requests failed after 6, 9 and 12 s; with the default
600 s, after 20, 30 and 40 minutes). Stand-in replicas (tests/cluster/stand_in.py): the frozen one's event pull
raises GetTimeoutError, as Ray's does after the wait, and the test counts the pulls."""

from __future__ import annotations

import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime.engine.errors import ReplicaUnavailableError
from tests.cluster.stand_in import GetTimeoutError, echo_script, install

CALL_TIMEOUT = 0.2


def _freeze(actor: Any) -> list[int]:
    """`actor` sends nothing more and answers no event pull: the pulls it was asked for."""
    pulls: list[int] = []

    def frozen(seq: int) -> Any:
        pulls.append(seq)
        raise GetTimeoutError()

    actor._events_since = frozen
    actor.script = lambda prompt, _options: [("tokens", [prompt[-1]], [None])]  # one token, then silence
    return pulls


def test_requests_on_a_frozen_replica_fail_without_waiting_on_it_again(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None, call_timeout=CALL_TIMEOUT)
    engine = ClusterEngine(cluster, str(tiny_dir))
    try:
        pulls = _freeze(cluster.actor(0))
        handles = [engine.submit([5, 6, 7 + i], 4) for i in range(4)]  # round robin: 0, 1, 0, 1
        for i, handle in enumerate(handles):
            if i % 2:
                assert handle.result(30).token_ids == (7 + i,) * 4
            else:
                with pytest.raises(ReplicaUnavailableError, match="sent nothing"):
                    handle.result(30)
        assert pulls == [], "a failed request waited on the frozen replica's events"
        cluster.actor(0).fail["generate"] = GetTimeoutError()  # the blocking call path (replay's warm-up, tests)
        for _ in range(2):  # round robin: one of them on the frozen replica
            try:
                cluster.generate([5, 6, 7], 2)
            except ReplicaUnavailableError as exc:
                assert "did not answer" in str(exc)
        assert pulls == []
        assert cluster.loads.in_flight() == 0 and cluster.alive == (0, 1)  # released; slow is not dead
        cluster.actor(0).script = echo_script
    finally:
        engine.close()


def test_the_poller_skips_a_frozen_replica_and_keeps_the_others_current(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the poller waited call_timeout (600 s by default) for a frozen replica's events each round,
    holding every other replica's events (their evictions, their pages computed) and the rejoin of dead replicas for
    as long. A round waits POLL_WAIT_S for a pull it asked now, and later rounds do not wait for it."""
    install(monkeypatch)
    from radixcache.router import EventBatch
    from radixcache.runtime.cluster import cluster as cluster_module
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    monkeypatch.setattr(cluster_module, "POLL_WAIT_S", 0.2, raising=False)
    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=0.01, call_timeout=600)
    never: Future[Any] = Future()  # replica 0 answers no event pull
    try:
        asked = _freeze_events(cluster.actor(0), never)
        deadline = time.monotonic() + 30  # a bound on a hang, never reached: a round takes POLL_WAIT_S at most
        while not asked and time.monotonic() < deadline:  # the poller waits on replica 0 now
            time.sleep(0.01)
        cluster.actor(1).batches = [EventBatch(1, 1, stored=(b"k" * 16,))]  # then replica 1 has news
        while cluster.index.pages(1) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cluster.index.pages(1) == 1, "the poller waited on the frozen replica"
        assert cluster.alive == (0, 1)  # slow is not dead
    finally:
        never.set_result(("i0", []))
        cluster.close()


def _freeze_events(actor: Any, never: Future[Any]) -> list[int]:
    """`actor` answers no event pull (each gets `never`): the pulls it was asked for."""
    asked: list[int] = []

    def frozen(seq: int) -> Future[Any]:
        asked.append(seq)
        return never

    actor._events_since = frozen
    return asked
