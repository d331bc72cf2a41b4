"""The front door's calls to every replica (stats, unpin, check, flush, the replay's warm-up) raised Ray's wrapper of
a replica engine's error (RayTaskError: its text a remote traceback with terminal colour codes, and not the engine's
type), where ReplicaCluster.generate raises the engine's own: /health/cache over a replica whose cache broke an
invariant answered Ray's traceback, and one whose engine was closing (a shutdown) a 500 where one engine's is a 503.
Each now raises the engine's own error. The front door over the Ray stand-in (tests/cluster/stand_in.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime.engine.errors import EngineClosedError, RequestTooLargeError
from tests.cluster.stand_in import RayTaskError, install

BROKEN = "block 7: ref count 2, but 1 request holds it"


@pytest.fixture
def front(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> Iterator[Any]:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    engine = ClusterEngine(ReplicaCluster("fake", 2, poll_interval=None, call_timeout=5.0), str(tiny_dir))
    yield engine
    engine.close()


def _fail(front: Any, method: str, error: BaseException) -> None:
    front.cluster.actor(1).fail[method] = RayTaskError(error)


def test_check_raises_the_engines_own_error(front: Any) -> None:
    _fail(front, "check", AssertionError(BROKEN))
    with pytest.raises(AssertionError, match=BROKEN) as caught:
        front.check()
    assert not isinstance(caught.value, RayTaskError)
    assert front.cluster.alive == (0, 1)  # a broken cache is a bug, not a dead replica


@pytest.mark.parametrize(
    ("method", "call", "error"),
    [
        ("unpin", lambda f: f.unpin([5, 6, 7], namespace="t"), ValueError("pin_holder: no such holder")),
        ("flush", lambda f: f.flush(), EngineClosedError("this engine is closed")),
        ("counted_stats", lambda f: f.stats, EngineClosedError("this engine is closed")),
        ("generate", lambda f: f.warm_up([5, 6, 7], 2), RequestTooLargeError("the prompt needs 99 pages")),
    ],
)
def test_each_call_to_every_replica_raises_the_engines_own_error(
    front: Any, method: str, call: Any, error: BaseException
) -> None:
    _fail(front, method, error)
    with pytest.raises(type(error)) as caught:
        call(front)
    assert caught.value is error


def test_health_cache_answers_the_engines_error_as_one_engine_does(front: Any) -> None:
    from radixcache.runtime.server import create_app

    with TestClient(create_app(front, "tiny", public_metrics=True), raise_server_exceptions=False) as client:
        _fail(front, "check", EngineClosedError("this engine is closed"))
        r = client.get("/health/cache")
        assert r.status_code == 503, r.text  # one engine closing: 503 shutting_down (it was a 500)
        assert r.json()["error"]["code"] == "shutting_down"
        _fail(front, "check", AssertionError(BROKEN))
        r = client.get("/health/cache")
        assert r.status_code == 500 and r.json()["error"]["message"] == f"internal error: AssertionError: {BROKEN}"
        del front.cluster.actor(1).fail["check"]
        assert client.get("/health/cache").status_code == 200


def test_check_of_a_real_replica_whose_cache_broke_raises_its_error(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    """Real replica engines in-process (tests/cluster/inproc_ray.py), replica 1's cache made to fail its check."""
    import torch

    from tests.cluster.inproc_ray import install as install_inproc

    ray = install_inproc(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    threads = torch.get_num_threads()
    front = ClusterEngine(
        ReplicaCluster(str(tiny_dir), 2, engine_kwargs={"page_size": 4}, poll_interval=None), str(tiny_dir)
    )
    try:
        assert front.check()["capacity_blocks"] > 0

        def broken() -> None:
            raise AssertionError(BROKEN)

        monkeypatch.setattr(ray.actors[1].obj.engine.cache, "check_invariants", broken)
        with pytest.raises(AssertionError, match=BROKEN) as caught:
            front.check()
        assert type(caught.value) is AssertionError
    finally:
        front.close()
        for actor in ray.actors:
            actor.obj.engine.close()
        torch.set_num_threads(threads)  # a replica sets its own count
