"""A replica that freezes between its last stream item (the result) and the front door's event pull: the front door
held the result it had in hand until the pull's wait, call_timeout (600 s by default), ran out: a request with a
0.3 s timeout returned after 600 s (with call_timeout=4, after 4 s). The pull after a request (its pages in the index
before the next turn) waits at most SYNC_WAIT_S now, and not past the request's timeout; the poller catches up once
the replica answers. Stand-in replicas (tests/cluster/stand_in.py): replica 0 sends every item, then answers no event
pull (each gets a future that is never set until the test lets it go)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from radixcache.router import EventBatch
from tests.cluster.stand_in import install

HANG_BOUND_S = 30  # a bound on a hang, never reached when the fix holds: without it each wait is call_timeout


def _freeze_events(actor: Any) -> tuple[list[int], Future[Any]]:
    """`actor` answers no event pull: the pulls asked of it, and the future that answers them all once set."""
    asked: list[int] = []
    never: Future[Any] = Future()

    def frozen(seq: int) -> Future[Any]:
        asked.append(seq)
        return never

    actor._events_since = frozen
    return asked, never


def test_a_result_is_not_held_behind_a_frozen_replica_s_event_pull(
    monkeypatch: pytest.MonkeyPatch, tiny_dir: Path
) -> None:
    install(monkeypatch)
    from radixcache.runtime.cluster import cluster as cluster_module
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster("fake", 1, router="round_robin", poll_interval=None, call_timeout=600)
    engine = ClusterEngine(cluster, str(tiny_dir))
    asked, never = _freeze_events(cluster.actor(0))
    try:
        # streamed, three at once, each with a timeout: all get their whole result, none waits call_timeout
        handles = [engine.submit([5, 6, 7 + i], 4, timeout=0.3) for i in range(3)]
        for i, handle in enumerate(handles):
            assert handle.result(HANG_BOUND_S).token_ids == (7 + i,) * 4
        assert asked, "the front door did not ask for the replica's events after its requests"
        # the blocking call (the replay's path), with a timeout
        assert cluster.generate([5, 6, 7], 2, timeout=0.3) == "done on 0"
        # without a timeout: SYNC_WAIT_S bounds the pull (0.2 s here, 5 s as shipped)
        monkeypatch.setattr(cluster_module, "SYNC_WAIT_S", 0.2)
        assert engine.submit([5, 6, 9], 2).result(HANG_BOUND_S).token_ids == (9, 9)
        assert cluster.alive == (0,) and cluster.loads.in_flight() == 0  # slow is not dead; every load released
        # the replica answers again: the next sync brings its pages into the index
        never.set_result(("i0", [EventBatch(0, 1, stored=(b"k" * 16,))]))
        cluster.poll(HANG_BOUND_S)
        assert cluster.index.pages(0) == 1
    finally:
        if not never.done():
            never.set_result(("i0", []))
        engine.close()
