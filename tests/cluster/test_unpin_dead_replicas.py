"""ClusterEngine.unpin with every replica dead returned 0, "nothing pinned", where check and flush say that no
replica answered (ReplicaUnavailableError, False). Real replica engines in-process (tests/cluster/inproc_ray.py)."""

from __future__ import annotations

import sys

import pytest

from radixcache.runtime.engine.errors import ReplicaUnavailableError
from tests.cluster.inproc_front import inproc_front

ENGINE = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64"}


def test_unpin_with_every_replica_dead_is_replica_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    with inproc_front(monkeypatch, 2, "round_robin", ENGINE) as front:
        front.generate([5, 6, 7, 8, 9], 2, pin=True)
        assert front.unpin([5, 6, 7, 8, 9]) == 1  # live replicas answer
        ray = sys.modules["ray"]
        for actor in list(ray.actors):
            ray.kill(actor)
        with pytest.raises(ReplicaUnavailableError):
            front.unpin()
