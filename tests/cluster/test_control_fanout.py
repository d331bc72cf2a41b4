"""The front door's control calls (stats for /metrics, unpin) ask every replica at once, and a read of their stats
waits a short bound, not call_timeout. Before, they asked one replica after another, each for up to call_timeout
(600 s): N frozen replicas (alive, answering nothing) held each /metrics scrape N x 600 s. Stand-in replicas
(tests/cluster/stand_in.py) whose answers come later, or never."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime.engine.errors import ReplicaUnavailableError
from tests.cluster.stand_in import install

HANG_S = 30.0  # a bound on a hang, never reached with the fix


def _front(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path, call_timeout: float) -> Any:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None, call_timeout=call_timeout)
    return ClusterEngine(cluster, str(tiny_dir))


def test_replica_0_answers_once_replica_1_was_asked(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> None:
    """Replica 0 answers only once replica 1 has been asked too: asked in turn, replica 0 ran out of call_timeout."""
    engine = _front(monkeypatch, tiny_dir, call_timeout=5.0)
    first, second = engine.cluster.actor(0), engine.cluster.actor(1)
    asked: list[Future[Any]] = [Future(), Future()]  # replica 0's answers: set when replica 1 is asked
    stats_0 = first._stats()
    first._stats, first._unpin = (lambda: asked[0]), (lambda *_: asked[1])
    real_stats = second._stats
    second._stats = _then(lambda: asked[0].set_result(stats_0), real_stats)
    second._unpin = _then(lambda: asked[1].set_result(2), lambda: 3)
    try:
        assert [s.prompt_tokens for s in engine.cluster.replica_stats()] == [100, 101]  # stand_in: 100 + replica
        assert engine.unpin() == 2 + 3
    finally:
        for f in asked:
            if not f.done():
                f.set_result(None)
        engine.close()


def _then(first: Any, answer: Any) -> Any:
    def call(*_: Any) -> Any:
        first()
        return answer()

    return call


def test_stats_of_frozen_replicas_wait_the_read_bound_and_name_them(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    engine = _front(monkeypatch, tiny_dir, call_timeout=600.0)
    from radixcache.runtime.cluster import fanout

    monkeypatch.setattr(fanout, "READ_WAIT_S", 0.2, raising=False)
    never: Future[Any] = Future()
    for r in (0, 1):
        engine.cluster.actor(r)._counted_stats = lambda: never  # frozen: no answer
    got: list[BaseException] = []

    def scrape() -> None:
        try:
            got.append(engine.stats)
        except BaseException as exc:
            got.append(exc)

    scraper = threading.Thread(target=scrape, daemon=True)
    try:
        scraper.start()
        scraper.join(HANG_S)
        assert len(got) == 1 and not scraper.is_alive(), "the read waited call_timeout (600 s) for each frozen replica"
        assert isinstance(got[0], ReplicaUnavailableError)
        assert "engine replica 0, 1 did not answer counted_stats" in str(got[0])
        assert engine.cluster.alive == (0, 1)  # slow is not dead
    finally:
        never.set_result(("i0", engine.cluster.actor(1)._stats()))
        engine.close()
