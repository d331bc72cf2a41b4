"""A request's `timeout` covers its wait in Ray's queue. A replica's actor runs at most max_concurrency calls at once;
past those a stream waits in Ray's queue, and the replica counted the request's timeout from when its call started
there (less the seconds spent before the send), so that wait was not in it: a request that waited there past its
whole timeout failed 10 s later with a 503 (the front door's grace for a replica that ends nothing), and one that
started there late ran on past its timeout by as long as it had waited. The front door holds the timeout itself
now (runtime.cluster.stream_wait.TimeoutCut): past it (and a 0.25 s grace for the replica's own end) it cancels the
request there and reports "timeout", with what was generated; one that had not started ends at once with nothing.

Real replica engines in-process (tests/cluster/inproc_ray.py), one replica's stream call held back as Ray's queue
holds it; and stand-in replicas (tests/cluster/stand_in.py) whose stream ends only when cancelled (a replica whose
own deadline is later than the front door's, as after a wait in Ray's queue)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.inproc_front import inproc_front
from tests.cluster.stand_in import FakeStream, install, result_for

ENGINE = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64"}
HANG_BOUND_S = 30  # a bound on a hang, never reached when the fix holds


def test_a_request_whose_timeout_passes_in_ray_s_queue_ends_with_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    with inproc_front(monkeypatch, 1, "round_robin", ENGINE) as front:
        ray = sys.modules["ray"]
        replica = ray.actors[0].obj
        stream, gate = replica.stream, threading.Event()

        ran = threading.Event()

        def queued(*args: Any) -> Any:  # the call waits for an actor thread (Ray's queue) until the gate opens
            gate.wait(HANG_BOUND_S)
            return _noted(stream(*args), ran)

        replica.stream = queued
        try:
            result = front.generate([5, 6, 7, 8], 4, timeout=0.3, ignore_eos=True)
            _cancel_landed(replica)  # the order pinned here: the cancel, then the call
        finally:
            gate.set()
        assert (result.finish_reason, result.token_ids, result.prompt_tokens) == ("timeout", (), 4)
        assert result.latency_s >= 0.3  # its times are the front door's: it waited its whole timeout
        assert front.wait_idle(HANG_BOUND_S)
        # the call ran once Ray's queue let it: cancelled on arrival (the front door's cancel was remembered there),
        # before it was submitted: the engine never saw it (it had admitted it, a prefill and a token, before)
        assert ran.wait(HANG_BOUND_S)
        stats = replica.engine.stats
        assert (stats.requests, stats.running, stats.prompt_tokens, stats.generated_tokens) == (0, 0, 0, 0)
        replica.stream = stream
        assert front.generate([5, 6, 7, 8], 4, timeout=30, ignore_eos=True).finish_reason == "length"  # serves on
        assert front.cluster.loads.in_flight() == 0


def test_a_cancel_of_a_request_waiting_in_ray_s_queue_ends_it_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: its caller's `result()` waited until an actor thread took the request (the cancel is remembered
    on the replica, which ends it when it starts), where one engine ends a queued request at its cancel."""
    with inproc_front(monkeypatch, 1, "round_robin", ENGINE) as front:
        ray = sys.modules["ray"]
        replica = ray.actors[0].obj
        stream, gate = replica.stream, threading.Event()

        ran = threading.Event()

        def queued(*args: Any) -> Any:
            gate.wait(HANG_BOUND_S)
            return _noted(stream(*args), ran)

        replica.stream = queued
        try:
            handle = front.submit([5, 6, 7, 8], 4, ignore_eos=True)
            deadline = time.monotonic() + HANG_BOUND_S
            while handle.request.replica is None and time.monotonic() < deadline:
                time.sleep(0.01)
            handle.cancel()
            result = handle.result(HANG_BOUND_S)
            _cancel_landed(replica)  # the order pinned here: the cancel, then the call
        finally:
            gate.set()
        assert (result.finish_reason, result.token_ids, result.prompt_tokens) == ("cancelled", (), 4)
        assert front.wait_idle(HANG_BOUND_S)  # its call ran once Ray's queue let it, cancelled there on arrival
        assert ran.wait(HANG_BOUND_S)  # before it was submitted: the engine never saw it
        stats = replica.engine.stats
        assert (stats.requests, stats.running, stats.prompt_tokens, stats.generated_tokens) == (0, 0, 0, 0)
        assert front.cluster.loads.in_flight() == 0


def test_a_cancelled_request_whose_replica_dies_is_not_sent_to_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a request its caller had cancelled, whose replica then died before starting it, was re-sent to
    a second replica (routed, counted as a retry, run there until the cancel that followed it landed)."""
    with inproc_front(monkeypatch, 2, "round_robin", ENGINE) as front:
        ray = sys.modules["ray"]
        replica0 = ray.actors[0].obj
        stream, gate = replica0.stream, threading.Event()

        def queued(*args: Any) -> Any:
            gate.wait(HANG_BOUND_S)
            return stream(*args)

        replica0.stream = queued
        try:
            handle = front.submit([5, 6, 7, 8], 4, ignore_eos=True)  # round robin: replica 0, in Ray's queue
            deadline = time.monotonic() + HANG_BOUND_S
            while not ray.actors[0].streams and time.monotonic() < deadline:  # its call is on its way (a kill fails it)
                time.sleep(0.01)
            handle.cancel()
            ray.kill(ray.actors[0])  # it dies before a thread took the call
            assert front.wait_idle(HANG_BOUND_S)
        finally:
            gate.set()
        assert handle.result(0).finish_reason == "cancelled"
        assert ray.actors[1].streams == []  # never sent to replica 1
        stats = front.cluster.stats()
        assert (stats.deaths, stats.retries, stats.routed) == (1, 0, {0: 1, 1: 0})
        assert front.cluster.loads.in_flight() == 0


def _cancel_landed(replica: Any) -> None:
    """Wait until the front door's cancel reached `replica` (remembered there: its stream has not started)."""
    deadline = time.monotonic() + HANG_BOUND_S
    while not replica._early_cancels and time.monotonic() < deadline:
        time.sleep(0.01)


def _noted(items: Iterator[Any], ran: threading.Event) -> Iterator[Any]:
    """`items` (a replica's stream), setting `ran` once it has ended."""
    try:
        yield from items
    finally:
        ran.set()


def _cancel_ends_it(actor: Any) -> None:
    """`actor`'s streams send their admission and one token, then nothing until cancelled: the cancel ends them
    "cancelled" with that token (the replica's own deadline, counted from a late start, has not come)."""
    streams: dict[str, tuple[FakeStream, list[int]]] = {}

    def stream(rid: str, prompt: list[int], options: Any, *_: Any) -> FakeStream:
        s = FakeStream([("admitted", None, None), ("tokens", [prompt[-1]], [None])])
        streams[rid] = (s, list(prompt))
        actor.streams.append(rid)
        return s

    def cancel(rid: str) -> bool:
        actor.cancels.append(rid)
        s, prompt = streams[rid]
        s._queue.put(("done", result_for(prompt, [prompt[-1]], "cancelled"), None))
        return True

    actor._stream, actor._cancel = stream, cancel


def test_a_request_running_past_its_timeout_is_cut_by_the_front_door(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster("fake", 1, router="round_robin", poll_interval=None, call_timeout=600)
    engine = ClusterEngine(cluster, str(tiny_dir))
    try:
        actor = cluster.actor(0)
        _cancel_ends_it(actor)
        handle = engine.submit([5, 6, 7], 8, timeout=0.3)
        result = handle.result(HANG_BOUND_S)
        assert (result.finish_reason, result.token_ids) == ("timeout", (7,))  # what it generated, as one engine's
        assert actor.cancels == [handle.rid]
        # a caller's own cancel stays "cancelled"
        handle = engine.submit([5, 6, 9], 8, timeout=HANG_BOUND_S)
        deadline = time.monotonic() + HANG_BOUND_S
        while handle.rid not in actor.streams and time.monotonic() < deadline:
            time.sleep(0.01)
        handle.cancel()
        assert handle.result(HANG_BOUND_S).finish_reason == "cancelled"
        # a cancel answers an unstarted request at once; its send ends (and leaves the load) after: wait for it
        assert engine.wait_idle(HANG_BOUND_S)
        assert cluster.loads.in_flight() == 0
    finally:
        engine.close()
