"""A replica whose engine loop died (its process lives: EngineDeadError on every request) passed the front door's
check before a re-send, which asked its `info`: a request whose replica died was re-sent there, failed again, and was
told "engine replicas 0, 1 died while serving this request; ... it may be what kills them". The check now asks the
replica's `check_alive`, which looks at the engine loop. The real replica class on real engines, in this process
(tests/cluster/inproc_front.py); the stand-in's version: test_poison_request.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from radixcache.runtime.engine.errors import EngineDeadError, ReplicaUnavailableError
from tests.cluster.inproc_front import inproc_front


def _kill_loop(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """End `engine`'s loop thread as a bug in the loop itself does (outside every per-request guard)."""

    def broken(_done: Any) -> None:
        raise RuntimeError("the loop broke")

    monkeypatch.setattr(engine._loop, "_deliver", broken)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the loop's own report of its bug: expected
    with pytest.raises(EngineDeadError):
        engine.generate([1, 2, 3], 1)
    deadline = time.monotonic() + 30
    while engine._loop.dead is None:
        assert time.monotonic() < deadline, "the loop did not die"
        time.sleep(0.01)


def test_a_request_re_sent_finds_the_replica_whose_loop_died_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    with inproc_front(monkeypatch, 2, "round_robin", {"page_size": 4}) as front:
        import ray  # the in-process stand-in, installed by inproc_front

        cluster = front.cluster
        _kill_loop(front.replicas[1], monkeypatch)
        assert ray.get(cluster.actor(1).info.remote(), timeout=5)["pid"]  # its process lives: info still answers
        ray.kill(cluster.actor(0))  # died before the request came, unseen by the front door
        assert cluster.alive == (0, 1)
        with pytest.raises(ReplicaUnavailableError, match="no live engine replica") as failed:
            front.generate([5, 6, 7], 2)
        assert "died while serving" not in str(failed.value) and "kills" not in str(failed.value), failed.value
        assert cluster.alive == () and cluster.stats().deaths == 2 and cluster.loads.in_flight() == 0
