"""A replica runs on one Ray node: replicas whose CPU share fits the cluster's total but no node are refused before
any is created (runtime.cluster.placement.check_cpus), on the in-process Ray stand-in (tests/cluster/inproc_ray.py)
whose `ray.nodes()` reports two live nodes of 1 CPU, in the shape Ray reports them, and a dead one that must not
count. The same on a real two-node Ray cluster: test_placement_nodes_ray.py (extended tier); every real-Ray start of
the default run (test_cluster_ray.py) reads the real `ray.nodes()` through the same check."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.inproc_ray import install


def assert_refused_per_node() -> None:
    """On two live nodes of 1 CPU (Ray's `remote` replaced by a failure): replicas that fit no node, or fewer nodes
    than asked, are refused naming the nodes' CPUs; one a node passes the check (and fails at `remote`)."""
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    with pytest.raises(ValueError, match=r"only 0 fit on the Ray cluster's nodes \(of 1, 1 CPUs\)"):
        ReplicaCluster("unused", 1, cpus=2.0, poll_interval=None)
    with pytest.raises(ValueError, match=r"only 2 fit .* \(of 1, 1 CPUs\)"):
        ReplicaCluster("unused", 3, cpus=0.5 + 1e-4, poll_interval=None)  # 0.5 fits twice a node; a bit more once
    with pytest.raises(AssertionError, match="were created"):  # one per node fits: past the check
        ReplicaCluster("unused", 2, cpus=1.0, poll_interval=None)


def no_actor(*_a: Any, **_k: Any) -> Any:
    raise AssertionError("replicas were created that Ray cannot place")


def _node(cpus: float, alive: bool = True) -> dict[str, Any]:
    return {"Alive": alive, "Resources": {"CPU": cpus, "memory": 1e9, "node:127.0.0.1": 1.0}}


def test_replicas_that_fit_the_total_but_no_node_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = install(monkeypatch)
    ray.nodes = lambda: [_node(1.0), _node(1.0), _node(4.0, alive=False)]  # type: ignore[attr-defined]
    ray.cluster_resources = lambda: {"CPU": 2.0}  # type: ignore[attr-defined]
    ray.remote = no_actor  # type: ignore[attr-defined]
    assert_refused_per_node()
