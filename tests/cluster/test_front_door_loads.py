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
    handle = engine.submit([i % 250 + 1 for i in range(400)], 50)
    _until(lambda: handle.request.output_ids == [7])
    load = engine.cluster.loads.load(handle.request.replica)
    assert load.pending_prefill_tokens == 0 and load.pending_decode_tokens == 50 and load.running == 1


def test_a_sample_routed_to_its_siblings_prefix_in_flight_counts_no_second_prefill(
    front: tuple[Any, threading.Event],
) -> None:
    """Regression: the front door asked the router for a replica (`choose`) and then counted the prefill the index
    alone left (`matched_pages`), not the route's: the second of n samples, sent where the first is computing the
    prompt (cache_aware counts that prefix in flight as cached, as its pages will be), counted the whole prompt
    again, so n samples of a new 400-token prompt weighed n prefills on their replica."""
    engine, release = front
    for r in (0, 1):  # both wait before their first token: neither prefill is done
        engine.cluster.actor(r).script = lambda prompt, options: [release.wait, ("done", result_for(prompt, [7]), None)]
    prompt = [i % 250 + 1 for i in range(400)]  # 100 whole pages, none cached anywhere yet
    first, second = engine.submit_group([prompt, prompt], 50)
    _until(lambda: engine.cluster.loads.in_flight() == 2)
    assert first.request.replica == second.request.replica  # the second follows the first's pages in flight
    load = engine.cluster.loads.load(first.request.replica)
    assert load.pending_prefill_tokens == len(prompt) and load.pending_decode_tokens == 100
