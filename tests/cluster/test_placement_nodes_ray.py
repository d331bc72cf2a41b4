"""A replica runs on one Ray node: replicas whose CPU share fits the cluster's total but no node (2 replicas of 2 CPUs
on two nodes of 1 CPU) were created, and Ray queued them for ever while the start waited, silently (the check
compared the share with the cluster's total). On a real two-node Ray cluster in this process (ray.cluster_utils);
the replicas' creation is replaced by a failure, so that a start that passes the check fails here at once instead of
waiting for ever."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.test_placement_nodes import assert_refused_per_node, no_actor

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one Ray cluster at a time (conftest.py)


@pytest.fixture
def two_nodes() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized()  # conftest.py shut the shared cluster down before this test
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


# Extended tier (tests/conftest.py): test_placement_nodes.py makes the same three starts with the same assertions on
# the in-process stand-in, its `ray.nodes()` two live nodes of 1 CPU in Ray's shape; the real `ray.nodes()` goes
# through the same check at every real-Ray start of the default run (test_cluster_ray.py). What only this test adds
# is a cluster of two real nodes. 8.1 s of the last full run under load (15.2 s in the next).
@pytest.mark.extended
def test_replicas_that_fit_the_total_but_no_node_are_refused(two_nodes: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ray.cluster_resources()["CPU"] == 2.0
    monkeypatch.setattr(ray, "remote", no_actor)
    assert_refused_per_node()
