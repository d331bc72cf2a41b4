"""`serve --replicas` at the HTTP level without Ray: the OpenAI app over the cluster's front door (ClusterEngine),
its replicas stand-ins (tests/cluster/stand_in.py) that relay engine errors as Ray does, die, or stop sending
mid-stream. A full queue on a replica is 429 with Retry-After, a prompt the replica's pool can never hold is 400,
no live replica is 503 `replica_unavailable`, and a replica that stops sending mid-stream ends the request within
the per-item timeout (a 503, or an error event then [DONE] in a stream) with the request cancelled on the replica
and its load released; the server then serves on. A relay that fails in the front door (the caller's listener)
cancels the request on its replica. The real-Ray version of the first three is in
test_cluster_ray.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime.engine.errors import QueueFullError, RequestTooLargeError
from tests.cluster.stand_in import RayActorError, RayTaskError, echo_script, install

ITEM_TIMEOUT = 0.3
BODY = {"model": "tiny", "prompt": [5, 6, 7, 8, 9], "max_tokens": 4, "temperature": 0}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> Iterator[tuple[TestClient, Any]]:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.server import create_app

    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None, call_timeout=ITEM_TIMEOUT)
    engine = ClusterEngine(cluster, str(tiny_dir))
    cluster.front = engine  # type: ignore[attr-defined]  (tests reach the front door through the fixture)
    with TestClient(create_app(engine, "tiny")) as client:
        yield client, cluster
    engine.close()


def _every_replica(cluster: Any, script: Any) -> None:
    for r in (0, 1):
        cluster.actor(r).script = script


def _error(response: Any, status: int, code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


def _serves_on(client: TestClient, cluster: Any) -> None:
    _every_replica(cluster, echo_script)
    r = client.post("/v1/completions", json=BODY)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    assert cluster.loads.in_flight() == 0


def test_a_full_queue_on_a_replica_is_429_with_retry_after(served: tuple[TestClient, Any]) -> None:
    client, cluster = served
    _every_replica(cluster, lambda *_: [RayTaskError(QueueFullError("3 requests already wait", retry_after=2.5))])
    for stream in (False, True):  # a refused stream answers with the status itself
        r = client.post("/v1/completions", json={**BODY, "stream": stream})
        error = _error(r, 429, "queue_full")
        assert error["type"] == "rate_limit_error" and int(r.headers["retry-after"]) == 3
    _serves_on(client, cluster)


def test_a_prompt_a_replica_can_never_hold_is_400(served: tuple[TestClient, Any]) -> None:
    client, cluster = served
    too_large = RequestTooLargeError("the prompt needs 99 pages, the pool has 64")
    _every_replica(cluster, lambda *_: [RayTaskError(too_large)])
    _error(client.post("/v1/completions", json=BODY), 400, "context_length_exceeded")
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    _error(client.post("/v1/chat/completions", json=chat), 400, "context_length_exceeded")
    _serves_on(client, cluster)


def test_dead_replicas_are_503_replica_unavailable(served: tuple[TestClient, Any]) -> None:
    client, cluster = served
    cluster.actor(0).script = lambda *_: [RayActorError("the actor died")]
    r = client.post("/v1/completions", json=BODY)  # replica 0 died before a token: retried on replica 1
    assert r.status_code == 200, r.text
    assert cluster.alive == (1,) and cluster.stats().retries == 1
    cluster.actor(1).script = lambda *_: [RayActorError("the actor died")]
    r = client.post("/v1/completions", json=BODY)
    _error(r, 503, "replica_unavailable")
    assert int(r.headers["retry-after"]) >= 1 and cluster.alive == ()
    _error(client.post("/v1/completions", json=BODY), 503, "replica_unavailable")  # none left: at once
    assert cluster.loads.in_flight() == 0
    # Regression: with no replica left /health/cache answered 200 "invariants: ok" (no replica to ask: no gauges),
    # where one engine whose loop died answers 503, and /metrics did; flush said every write was done.
    _error(client.get("/health/cache"), 503, "replica_unavailable")
    assert client.get("/metrics").status_code == 503
    assert cluster.front.flush() is False


def test_a_replica_that_stops_mid_stream_ends_the_request_and_releases_it(served: tuple[TestClient, Any]) -> None:
    client, cluster = served
    _every_replica(cluster, lambda prompt, _o: [("tokens", [prompt[-1]], [None])])  # one token, then silence
    error = _error(client.post("/v1/completions", json=BODY), 503, "replica_unavailable")
    assert "sent nothing" in error["message"]
    with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as r:
        assert r.status_code == 200  # its first token was sent: the failure comes as an event
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "replica_unavailable", events
    cancelled = [rid for r in (0, 1) for rid in cluster.actor(r).cancels]
    streamed = [rid for r in (0, 1) for rid in cluster.actor(r).streams]
    assert sorted(cancelled) == sorted(streamed)  # each stalled request was cancelled on its replica
    assert cluster.alive == (0, 1) and cluster.stats().deaths == 0  # slow is not dead
    _serves_on(client, cluster)


def test_a_relay_that_fails_in_the_front_door_cancels_the_request_on_its_replica(
    served: tuple[TestClient, Any],
) -> None:
    """The caller's side of a stream raising (its listener) fails that request and stops its work on the replica."""
    _, cluster = served
    front = cluster.front
    gate = threading.Event()
    _every_replica(cluster, lambda p, o: (gate.wait(10), echo_script(p, o))[1])
    handle = front.submit([5, 6, 7], 4)

    def broken(_request: Any) -> None:
        raise RuntimeError("the caller's relay broke")

    handle.request.listener = broken
    gate.set()
    with pytest.raises(RuntimeError, match="relay broke"):
        handle.result(10)
    assert [handle.rid] == [rid for r in (0, 1) for rid in cluster.actor(r).cancels]
    assert cluster.loads.in_flight() == 0


def test_a_session_header_is_bounded_as_the_user_field(served: tuple[TestClient, Any]) -> None:
    """Regression: X-Session-Id had no bound (the `user` field has 256 characters), and the router remembers up to
    100,000 sessions: each request could pin kilobytes of the front door's memory. Now longer is a 400 naming it."""
    client, cluster = served
    _every_replica(cluster, echo_script)
    for stream in (False, True):
        r = client.post("/v1/completions", json={**BODY, "stream": stream}, headers={"X-Session-Id": "s" * 5000})
        error = _error(r, 400, None)
        assert error["param"] == "X-Session-Id" and "256" in error["message"]
    assert cluster.stats().routed == {0: 0, 1: 0}
    r = client.post("/v1/completions", json=BODY, headers={"X-Session-Id": "s" * 256})
    assert r.status_code == 200, r.text
