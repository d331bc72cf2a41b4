"""The real-Ray tests of this folder (xdist group "ray": one worker runs them, one after another) share one local
Ray cluster and one tiny checkpoint: test_cluster_ray's in-process ReplicaClusters, and test_serve_replicas' `serve
--replicas`, which joins it with --ray-address. Starting a cluster and shutting it down costs about 2 + 1.4 s of a
2-core machine (its autoscaler monitor alone takes 1 s to stop); each test still starts its own replicas.

The cluster is shut down before any test that does not use it, except this folder's tests outside the "ray"
group (pytest_runtest_teardown below), and after the last test: `replay --replicas` (the CLI's local start) and
tests/router's Ray sweeps, which start Ray in this process, never find it running. (A "package" fixture would not
do: this folder is no package, so it would live to the session's end.) Under `-n 2 --dist loadgroup` one worker
runs the group's tests in a row.

Within the group, this folder's tests that do not use the shared cluster (those that start Ray of their own, or none)
run first, then those that do (pytest_collection_modifyitems below): the cluster then starts once, not again after
each module's first test that does not use it (4 starts in the collection order, each about 3.4 s of a 2-core
machine with its shutdown)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
_running: dict[str, str] = {}  # "address": the shared cluster's, while it runs
# A call in flight on an actor whose process died waits this long for the actor's death cause before it fails (Ray's
# default: 1 s). A replica restarts (max_restarts=-1), so no cause comes, and each death the tests cause cost its
# call that whole second (the poison request's two: 3.6 s -> 1.3 s); the error raised is the same ("temporarily
# unavailable"), the front door reads every actor error alike (ReplicaCluster.actor_errors).
_SYSTEM_CONFIG = {"timeout_ms_task_wait_for_death_info": 100}


@pytest.fixture
def local_ray() -> str:
    """A local Ray cluster of 2 CPUs, this process its driver (started by the first test of a run that asks for
    it); its address (GCS), for processes to join."""
    if "address" not in _running:
        ray = pytest.importorskip("ray")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config=_SYSTEM_CONFIG)
        _running["address"] = ray.get_runtime_context().gcs_address
    return _running["address"]


def _in_ray_group(item: pytest.Item) -> bool:
    """Whether `item` is one of this folder's tests in the xdist group "ray"."""
    groups = {mark.args[0] if mark.args else mark.kwargs.get("name") for mark in item.iter_markers("xdist_group")}
    return Path(item.path).parent == HERE and "ray" in groups


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This folder's "ray" tests, in the places they hold: first those that do not use `local_ray`, then those that
    do, each kind in collection order (a stable sort). Every test still runs; only where the shared cluster starts
    changes: once, before the first test that uses it."""
    places = [i for i, item in enumerate(items) if _in_ray_group(item)]
    ordered = sorted((items[i] for i in places), key=lambda item: "local_ray" in item.fixturenames)
    for i, item in zip(places, ordered, strict=True):
        items[i] = item


def _keeps_it(item: pytest.Item | None) -> bool:
    """Whether the cluster may stay up for the next test `item`: one that uses it, or one of this folder outside the
    "ray" group (those start no Ray; this folder's hook sees their teardown too). A test elsewhere might start Ray
    in this process, and this hook would not see its teardown: the cluster stops before it, and after the last."""
    if item is None:
        return False
    if "local_ray" in getattr(item, "fixturenames", ()):
        return True
    group = item.get_closest_marker("xdist_group")
    return Path(item.path).parent == HERE and (group is None or group.args[:1] != ("ray",))


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Shut the shared cluster down unless the next test keeps it (`_keeps_it`)."""
    if "address" in _running and not _keeps_it(nextitem):
        import ray

        del _running["address"]
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint (tests/cli/conftest.py), written once for this folder's tests (they only read it)."""
    path = Path(__file__).resolve().parents[1] / "cli" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_cli_conftest", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.write_tiny_checkpoint(tmp_path_factory.mktemp("models") / "tiny")
