"""A request's `timeout` (the server's --request-timeout) counts from when the front door took it, as one Engine counts
it from `submit`: a replica counted it from when its own engine built the request, so a request re-sent after its
replica died got the whole timeout again there (the front door sends the seconds spent: a wait in Ray's queue for an
actor thread is still not counted, docs/replicas.md). Two real replica engines, in-process
(tests/cluster/inproc_ray.py): the first holds the request (its loop held) past its timeout, then dies."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from radixcache.runtime.testing import hold_engine_loop
from tests.cluster.inproc_front import inproc_front

ENGINE = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64"}
TIMEOUT = 1.0


def resent_past_its_timeout(front: Any) -> None:
    """A request held on replica 0 (its loop held) past its timeout, then re-sent when replica 0 dies: replica 1 must
    end it at its timeout, not give it the whole timeout again."""
    ray = sys.modules["ray"]
    release = hold_engine_loop(front.replicas[0])  # round robin: the first request goes to replica 0
    try:
        handle = front.submit([5, 6, 7, 8, 9], 4, ignore_eos=True, timeout=TIMEOUT)
        time.sleep(TIMEOUT * 1.2)  # past its timeout, held on replica 0 (a held loop times nothing out)
        assert not handle.done() and handle.request.replica == 0
        ray.kill(ray.actors[0])  # no token sent: re-sent to replica 1, which is idle
        result = handle.result(30)
    finally:
        release()
    assert handle.request.replica == 1
    assert result.finish_reason == "timeout", "replica 1 gave the request its whole timeout again"
    assert len(result.token_ids) < 4


def test_a_request_resent_after_its_replica_died_keeps_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    with inproc_front(monkeypatch, 2, "round_robin", ENGINE) as front:
        resent_past_its_timeout(front)
        # The same request with room to run: it is not cut short (a loaded machine may take over a second for it).
        control = front.generate([5, 6, 7, 8, 9], 4, ignore_eos=True, timeout=60)
        assert control.finish_reason == "length" and len(control.token_ids) == 4
