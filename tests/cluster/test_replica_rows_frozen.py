"""The replay's per-replica table (`replay --replicas`, ClusterEngine.per_replica) with a replica frozen at the end of
the run (alive to Ray, answering nothing): the stats read over every replica raised ReplicaUnavailableError once one
had not answered, so the replay ended with a traceback after its summary table, and its replicas were never closed.
Each replica keeps its row now, the frozen one with "-" for the counts only it knows. Stand-in replicas
(tests/cluster/stand_in.py): replica 0's stats call never answers until the test lets it go."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.cluster.stand_in import install


def test_the_per_replica_table_keeps_a_frozen_replica_s_row(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> None:
    install(monkeypatch)
    from radixcache.cli.replicas import replica_table
    from radixcache.runtime.cluster import fanout
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine

    monkeypatch.setattr(fanout, "READ_WAIT_S", 0.2)  # the read's bound on a frozen replica (5 s as shipped)
    cluster = ReplicaCluster("fake", 2, router="round_robin", poll_interval=None, call_timeout=600)
    engine = ClusterEngine(cluster, str(tiny_dir))
    never: Future[Any] = Future()
    cluster.actor(0)._counted_stats = lambda: never
    try:
        for i in range(3):  # round robin: 0, 1, 0
            assert engine.generate([5, 6, 7, i + 1], 2).token_ids == (i + 1,) * 2
        rows = engine.per_replica()
        assert [(r["replica"], r["routed"], r["prompt_tokens"], r["hit_rate"]) for r in rows] == [
            (0, 2, None, None),
            (1, 1, 101, 11 / 101),  # stand_in: prompt 100 + replica, cached 10 + replica
        ]
        console = Console(width=120, record=True)
        console.print(replica_table(engine))
        lines = [line.split() for line in console.export_text().splitlines() if line.strip().startswith("│")]
        assert ["│", "0", "│", "2", "│", "-", "│", "-", "│", "-", "│", "0", "│"] in lines
        assert cluster.alive == (0, 1)  # slow is not dead
    finally:
        never.set_result(("i0", None))
        engine.close()
