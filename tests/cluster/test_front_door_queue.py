"""`/health/cache`'s `queued` behind replicas: the front door's requests that no replica has started yet (before, the
front door's `queue.waiting` was a constant 0, so a request held before its replica started it was never seen).
Replicas are stand-ins (tests/cluster/stand_in.py); no Ray."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.cluster.stand_in import echo_script, install


def test_health_cache_counts_the_requests_no_replica_has_started(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.server import create_app

    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None)
    engine = ClusterEngine(cluster, str(tiny_dir))
    gate = threading.Event()

    def held(prompt: list[int], options: Any) -> list[Any]:  # replica 0 starts nothing until the gate opens
        return [lambda: gate.wait(30), *echo_script(prompt, options)]

    cluster.actor(0).script = held
    with TestClient(create_app(engine, "tiny")) as client:
        try:
            assert client.get("/health/cache").json()["queued"] == 0
            waiting = engine.submit([5, 6, 7], 2)  # round robin: replica 0, held
            assert client.get("/health/cache").json()["queued"] == 1
            assert engine.generate([5, 6, 8], 2).finish_reason == "length"  # replica 1 starts and ends it
            assert client.get("/health/cache").json()["queued"] == 1  # the held one still waits
            gate.set()
            assert waiting.result(30).token_ids == (7, 7)
            assert client.get("/health/cache").json()["queued"] == 0
        finally:
            gate.set()  # before the server's shutdown drains the held request
    engine.close()


@pytest.mark.parametrize("queue_timeout", [None, 30.0])
def test_health_cache_stops_counting_a_request_at_its_admission(
    monkeypatch: pytest.MonkeyPatch, queue_timeout: float | None
) -> None:
    """A request its replica admitted is no longer queued, before its first token too: without --queue-timeout the
    replica reported no admission, so the front door counted a request admitted and in its prefill as queued until
    its first token came back. A real replica engine (in-process), whose forward pass is held after admission."""
    from radixcache.runtime.server import create_app
    from tests.cluster.inproc_front import inproc_front

    engine_kwargs = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64", "queue_timeout": queue_timeout}
    with inproc_front(monkeypatch, 1, "round_robin", engine_kwargs) as engine:
        replica = engine.replicas[0]
        forward, entered, gate = replica.runner.step, threading.Event(), threading.Event()

        def held(*args: Any) -> Any:  # the first forward pass runs only once the gate opens
            entered.set()
            gate.wait(30)
            return forward(*args)

        monkeypatch.setattr(replica.runner, "step", held)
        # the invariants are checked between two steps, and the loop is inside one: only the gauges, while held
        monkeypatch.setattr(replica, "check", lambda timeout=None: {"locked_blocks": 0})
        with TestClient(create_app(engine, "tiny")) as client:
            try:
                handle = engine.submit([5, 6, 7, 8, 9], 2)
                assert entered.wait(30), "the replica never ran its forward pass"
                assert _queued_once_settled(client) == 0  # admitted (its prefill runs), no token yet
                assert not handle.request.output_ids
                gate.set()
                assert len(handle.result(30).token_ids) == 2
                assert client.get("/health/cache").json()["queued"] == 0
            finally:
                gate.set()


def _queued_once_settled(client: TestClient, bound_s: float = 10.0) -> int:
    """/health/cache's `queued` once it reads 0, or after `bound_s` seconds (the replica's word of an admission
    crosses threads: it may take a poll or two)."""
    deadline = time.monotonic() + bound_s
    while True:
        queued = client.get("/health/cache").json()["queued"]
        if queued == 0 or time.monotonic() > deadline:
            return queued
        time.sleep(0.02)
