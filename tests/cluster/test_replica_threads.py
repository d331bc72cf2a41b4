"""Each replica's engine runs on the torch threads it is given (`threads=`, the CLI's --threads, default cores / N):
since the actor's thread count (max_concurrency: a thread per request its engine may hold, 136 by default) took the
same local name, every replica's engine was built with that count of torch threads instead, and its process spun
them all (two replicas on two cores: each several times slower). A thread count or engine options no replica can
start with are refused before any starts. The real replica class, in-process (tests/cluster/inproc_ray.py)."""

from __future__ import annotations

import pytest
import torch

from radixcache.runtime.testing import tiny_model
from tests.cluster.inproc_ray import install


@pytest.mark.parametrize("threads", [1, 2])
def test_a_replica_engine_runs_on_the_threads_it_was_given(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    ray = install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster, actor_threads

    engine_kwargs = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64", "max_queue": 4}
    assert actor_threads(engine_kwargs) not in (1, 2)
    before = torch.get_num_threads()
    try:
        cluster = ReplicaCluster(
            tiny_model(seed=7), 1, engine_kwargs=engine_kwargs, threads=threads, poll_interval=None
        )  # type: ignore[arg-type]
        engine = ray.actors[0].obj.engine
        try:
            assert engine.threads == threads
            assert torch.get_num_threads() == threads  # the replica's process: set by the replica
        finally:
            cluster.close()
            engine.close()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [0, -1, 2.5, None, True, "2", 10**6])
def test_a_thread_count_no_replica_can_run_is_refused_before_any_starts(
    monkeypatch: pytest.MonkeyPatch, threads: object
) -> None:
    """Regression: the count went unchecked to every replica's constructor (torch.set_num_threads), which failed
    there: on Ray, each actor's death, its error a traceback in Ray's text."""
    ray = install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    before = torch.get_num_threads()
    try:
        with pytest.raises(ValueError, match=r"threads \(each replica's torch threads\) must be an int"):
            ReplicaCluster(tiny_model(seed=7), 2, threads=threads, poll_interval=None)  # type: ignore[arg-type]
    finally:
        torch.set_num_threads(before)
    assert ray.actors == []


@pytest.mark.parametrize("enable_cache", [False, 0, None])
def test_replicas_without_their_cache_are_refused_before_any_starts(
    monkeypatch: pytest.MonkeyPatch, enable_cache: object
) -> None:
    """Regression: every replica's constructor failed its assertion that the cache is on; on Ray, each actor died
    with that traceback in Ray's text (the CLI refuses --no-cache with --replicas; the Python API did not)."""
    ray = install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    before = torch.get_num_threads()
    try:
        with pytest.raises(ValueError, match="engine replicas need their cache"):
            ReplicaCluster(tiny_model(seed=7), 2, engine_kwargs={"enable_cache": enable_cache}, poll_interval=None)  # type: ignore[arg-type]
    finally:
        torch.set_num_threads(before)
    assert ray.actors == []
