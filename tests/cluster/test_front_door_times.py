"""A result's times behind replicas count from when the front door took the request, as one Engine's count from
`submit`: the replica's engine counted them from its own arrival, so the server's TTFT histogram ("request arrival
to first token") and the replay's TTFT left out the routing, the way to the replica, a wait in Ray's queue for an
actor thread, and the time spent on a replica that died before the request was re-sent. Two real replica engines
in-process (tests/cluster/inproc_ray.py): the request waits WAIT_S on replica 0 (its loop held), which then dies,
and replica 1 serves it; every time it reports must be at least that wait."""

from __future__ import annotations

import sys
import time

import pytest

from radixcache.runtime.testing import hold_engine_loop
from tests.cluster.inproc_front import inproc_front

ENGINE = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64"}
WAIT_S = 0.5


def test_a_resent_request_reports_its_times_from_the_front_door(monkeypatch: pytest.MonkeyPatch) -> None:
    with inproc_front(monkeypatch, 2, "round_robin", ENGINE) as front:
        ray = sys.modules["ray"]
        release = hold_engine_loop(front.replicas[0])  # round robin: the first request goes to replica 0
        try:
            t0 = time.monotonic()
            handle = front.submit([5, 6, 7, 8, 9], 4, ignore_eos=True)
            time.sleep(WAIT_S)
            assert not handle.done() and handle.request.replica == 0
            ray.kill(ray.actors[0])  # no token sent: re-sent to replica 1
            result = handle.result(30)
            took = time.monotonic() - t0
        finally:
            release()
        assert handle.request.replica == 1 and len(result.token_ids) == 4
        assert WAIT_S <= result.queue_s <= result.ttft_s <= result.latency_s <= took, result
