"""The load the front door counts on each replica follows LoadTracker's protocol (docs/routing.md): a request is
dispatched with the prefill the router expects it to compute there, and its prefill leaves the load once its replica
has computed it (its first token). Replicas are stand-ins (tests/cluster/stand_in.py) whose streams pause on demand."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.stand_in import install, result_for

PAGE = 4  # the stand-in's page size


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> Iterator[tuple[Any, threading.Event]]:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    engine = ClusterEngine(ReplicaCluster("fake", 2, poll_interval=None), str(tiny_dir))
    release = threading.Event()
    for r in (0, 1):  # a first token, then a decode that waits for the test
        engine.cluster.actor(r).script = lambda prompt, options: [
            ("tokens", [7], [None]),
            release.wait,
            ("done", result_for(prompt, [7, 7]), None),
        ]
    try:
        yield engine, release
    finally:
        release.set()
        engine.close()


def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_request_past_its_first_token_counts_only_its_decode(front: tuple[Any, threading.Event]) -> None:
    """Regression: the front door never told the tracker a prefill was done, so a replica decoding a request with a
    long prompt carried that prompt's prefill as pending work until the request ended (400 tokens: 1.1 s of work
    that was done), and cache_aware steered requests whose prefix it held elsewhere."""
    engine, _ = front
    handle = engine.submit(list(range(1, 401)), 50)
    _until(lambda: handle.request.output_ids == [7])
    load = engine.cluster.loads.load(handle.request.replica)
    assert load.pending_prefill_tokens == 0 and load.pending_decode_tokens == 50 and load.running == 1
