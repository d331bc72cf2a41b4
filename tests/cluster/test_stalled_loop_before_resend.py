"""A replica whose engine loop is stuck in a step that never returns (its process and its control threads live)
passed the front door's check before a re-send (`check_alive` looked only for a dead loop): a request whose replica
died was re-sent there and waited `call_timeout` (600 s by default). The check now also finds a loop that has had
work and made no progress for the cluster's `stall_timeout` (EngineStalledError, ended for Ray to restart as a dead
loop is), and the wait for the answers is the cluster's `live_check_s`. The real replica class on real engines, in
this process (tests/cluster/inproc_front.py); the stuck step is a stand-in that blocks until the test lets it go."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from radixcache.runtime.engine.errors import EngineDeadError, EngineStalledError, ReplicaUnavailableError
from tests.cluster.inproc_front import inproc_front


def _stick_loop(engine: Any, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """`engine`'s next step blocks until the returned event is set; a request is sent to start it."""
    opened, entered = threading.Event(), threading.Event()
    real = engine.scheduler.step

    def stuck() -> None:
        entered.set()
        opened.wait()
        real()

    monkeypatch.setattr(engine.scheduler, "step", stuck)
    engine.submit([1, 2, 3], 1)
    assert entered.wait(30)
    return opened


def test_a_request_re_sent_finds_the_replica_whose_loop_is_stuck_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    with inproc_front(monkeypatch, 2, "round_robin", {"page_size": 4}) as front:
        import ray  # the in-process stand-in, installed by inproc_front

        cluster = front.cluster
        cluster.stall_timeout, cluster.call_timeout = 0.05, 20.0  # (the fix's bound; the failure's wait)
        opened = _stick_loop(front.replicas[1], monkeypatch)
        try:
            while time.monotonic() - front.replicas[1]._loop.beat < 0.05:  # stuck for longer than stall_timeout
                threading.Event().wait(0.01)
            ray.kill(cluster.actor(0))  # died before the request came, unseen by the front door
            with pytest.raises(ReplicaUnavailableError) as failed:
                front.generate([5, 6, 7], 2)
            assert "no live engine replica" in str(failed.value), failed.value
            assert cluster.alive == () and cluster.stats().deaths == 2 and cluster.loads.in_flight() == 0
        finally:
            opened.set()


def test_check_alive_finds_a_stuck_loop_and_passes_an_idle_or_a_working_one(monkeypatch: pytest.MonkeyPatch) -> None:
    with inproc_front(monkeypatch, 1, "round_robin", {"page_size": 4}) as front:
        engine = front.replicas[0]
        engine.check_alive(stall_s=0.0)  # idle: no loop thread, nothing to be stuck in
        assert engine.generate([1, 2, 3], 2).finish_reason == "length"
        engine.check_alive(stall_s=0.0)
        opened = _stick_loop(engine, monkeypatch)
        try:
            engine.check_alive(stall_s=30.0)  # stuck, but not for that long: a long step is not a dead loop
            with pytest.raises(EngineStalledError, match="stuck") as stalled:
                engine.check_alive(stall_s=0.0)
            assert isinstance(stalled.value, EngineDeadError) and isinstance(stalled.value.cause, TimeoutError)
        finally:
            opened.set()
        engine.check_alive()  # (no stall_s: the dead-loop check alone)


@pytest.mark.parametrize("bad", [{"live_check_s": -1.0}, {"stall_timeout": float("nan")}, {"live_check_s": None}])
def test_the_liveness_bounds_are_validated(monkeypatch: pytest.MonkeyPatch, bad: dict) -> None:
    from radixcache.runtime.cluster.placement import seconds_option

    ((name, value),) = bad.items()
    with pytest.raises(ValueError, match=name):
        seconds_option(name, value, none_ok=name == "stall_timeout")
