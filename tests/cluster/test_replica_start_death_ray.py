"""A replica whose process dies while it starts (an OOM kill as it loads the model or allocates --kv-memory, a native
crash) fails the start, naming the replica: Ray restarted it for ever (max_restarts=-1), each start died again, and
the start waited on its `info` for ever, silently (log_to_driver=False). On a real local Ray cluster: one replica's
constructor kills its own process (SIGKILL, as the OOM killer does), the other starts as usual."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one Ray cluster at a time (conftest.py)


def test_a_replica_that_dies_while_it_starts_fails_the_start(
    local_ray: str, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixcache.runtime.cluster import cluster as cluster_module
    from radixcache.runtime.cluster.replica import EngineReplica

    class DiesStarting(EngineReplica):  # a local class: Ray ships it by value to the replicas' processes
        def __init__(self, replica: int, *args: Any) -> None:
            if replica == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            super().__init__(replica, *args)

    monkeypatch.setattr(cluster_module, "EngineReplica", DiesStarting)
    outcome: list[BaseException] = []

    def start() -> None:
        try:
            cluster_module.ReplicaCluster(str(tiny_dir), 2, cpus=0.5, poll_interval=None).close()
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(120)  # it waited for ever
    assert not thread.is_alive(), "the start still waits on a replica that dies at each start"
    (error,) = outcome
    assert isinstance(error, RuntimeError) and "engine replica 1's process died while it started" in str(error)
