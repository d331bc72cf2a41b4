"""A replica on another machine reads another wall clock: the front door sent its own time.time() readings (when it
took a request, when it sent it) and the replica subtracted them from its own, so a skew between the two clocks cut
or stretched a request's `timeout` (--request-timeout) and its queue timeout by the skew. The front door now sends
durations measured on its own clock; the replica measures the rest on its own. Two real replica engines in-process
(tests/cluster/inproc_ray.py), the replica's wall clock skewed by SKEW_S either way."""

from __future__ import annotations

import time
import types

import pytest

from tests.cluster.inproc_front import inproc_front
from tests.cluster.test_front_door_timeout import resent_past_its_timeout

ENGINE = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64"}
SKEW_S = 3600.0


def skew_replica_clock(monkeypatch: pytest.MonkeyPatch, skew: float) -> None:
    """The replica module's wall clock reads `skew` seconds off the front door's (its monotonic clocks are its own)."""
    from radixcache.runtime.cluster import replica

    clock = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time) if not n.startswith("_")})
    clock.time = lambda: time.time() + skew
    monkeypatch.setattr(replica, "time", clock, raising=False)


def test_a_replica_clock_ahead_cuts_no_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica an hour ahead failed every request at once: its queue timeout as 'waited 3600 s to reach its
    replica', and a request's timeout (without a queue timeout) as finish_reason 'timeout' before any token."""
    with inproc_front(monkeypatch, 1, "round_robin", {**ENGINE, "queue_timeout": 60.0}) as front:
        skew_replica_clock(monkeypatch, SKEW_S)
        result = front.generate([5, 6, 7, 8, 9], 4, ignore_eos=True, timeout=60)
        assert result.finish_reason == "length" and len(result.token_ids) == 4


def test_a_replica_clock_behind_stretches_no_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica an hour behind gave a request re-sent after its replica died its whole timeout again (the time it
    had spent counted as none): held on replica 0 past its timeout, then re-sent to replica 1, it must time out."""
    with inproc_front(monkeypatch, 2, "round_robin", ENGINE) as front:
        skew_replica_clock(monkeypatch, -SKEW_S)
        resent_past_its_timeout(front)
