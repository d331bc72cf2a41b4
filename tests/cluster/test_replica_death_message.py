"""A replica killed mid-stream (its process gone: Ray fails the stream's next item) gave the client a 503 whose message
was Ray's error: the actor id, its node and "RpcError ... rpc_code: 14". The client gets a plain message naming the
replica; Ray's text goes to the server's log. The same for a request whose second replica died under it (its
re-send refused). The app over the front door, its replicas the Ray stand-in (tests/cluster/stand_in.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.cluster.stand_in import RayActorError, install

# What Ray raises for a killed replica's stream (Ray 2.x's ActorDiedError text, shortened)
RAY_TEXT = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: EngineReplica\n\tactor_id: "
    "6c3b1f0a9d2e4b7c8a5f01000000\n\tpid: 4242\n\tip: 127.0.0.1\nThe actor is dead because its worker process has "
    "died. Worker exit type: SYSTEM_ERROR Worker exit detail: RpcError: failed to connect to all addresses "
    "rpc_code: 14"
)
INTERNALS = ("actor_id", "6c3b1f0a", "RpcError", "rpc_code", "EngineReplica", "pid: 4242")
BODY = {"model": "tiny", "prompt": [5, 6, 7, 8, 9], "max_tokens": 4, "temperature": 0}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> Iterator[tuple[TestClient, Any]]:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.server import create_app

    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None, call_timeout=5.0)
    engine = ClusterEngine(cluster, str(tiny_dir))
    with TestClient(create_app(engine, "tiny")) as client:
        yield client, cluster
    engine.close()


def _killed_after_a_token(prompt: list[int], _options: Any) -> list[Any]:
    return [("tokens", [prompt[-1]], [None]), RayActorError(RAY_TEXT)]


def _plain(message: str) -> None:
    assert not [word for word in INTERNALS if word in message], message


def test_a_replica_killed_mid_request_is_a_plain_503(served: tuple[TestClient, Any], caplog: Any) -> None:
    client, cluster = served
    cluster.actor(0).script = _killed_after_a_token
    with caplog.at_level(logging.WARNING, logger="radixcache.cluster"):
        r = client.post("/v1/completions", json=BODY)  # round robin: replica 0 first
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "replica_unavailable"
    assert "replica 0" in error["message"] and "mid-request" in error["message"]
    _plain(error["message"])
    assert "rpc_code: 14" in caplog.text  # the details stay in the server's log


def test_a_replica_killed_mid_stream_is_a_plain_error_event(served: tuple[TestClient, Any]) -> None:
    client, cluster = served
    cluster.actor(0).script = _killed_after_a_token
    with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as r:
        assert r.status_code == 200  # its first token was sent: the failure comes as an event
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "replica_unavailable" and "replica 0" in error["message"]
    _plain(error["message"])


def test_a_request_two_replicas_died_under_is_a_plain_503(served: tuple[TestClient, Any], caplog: Any) -> None:
    client, cluster = served
    for replica in (0, 1):
        cluster.actor(replica).script = lambda *_: [RayActorError(RAY_TEXT)]  # dies before its first token
    with caplog.at_level(logging.WARNING, logger="radixcache.cluster"):
        r = client.post("/v1/completions", json=BODY)
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "replica_unavailable" and "replicas 0, 1 died" in error["message"]
    _plain(error["message"])
    assert "rpc_code: 14" in caplog.text


def test_an_engine_that_died_mid_request_is_named_with_its_own_error(served: tuple[TestClient, Any]) -> None:
    """The engine's own error (its loop thread died: EngineDeadError, relayed in Ray's wrapper) is no Ray internal:
    the message keeps it, as it did before Ray's text was left out."""
    from radixcache.runtime.engine.errors import EngineDeadError
    from tests.cluster.stand_in import RayTaskError

    client, cluster = served
    dead = EngineDeadError(RuntimeError("a bug in the loop"))
    cluster.actor(0).script = lambda prompt, _o: [("tokens", [prompt[-1]], [None]), RayTaskError(dead)]
    r = client.post("/v1/completions", json=BODY)
    assert r.status_code == 503, r.text
    message = r.json()["error"]["message"]
    assert "replica 0 became unavailable mid-request" in message and str(dead) in message
