"""`ReplicaCluster(call_timeout=...)` as the Engine's own bounds are taken: None or infinity is no bound (infinity
reached Ray, whose timeouts are whole milliseconds: every request failed with OverflowError, 'cannot convert float
infinity to integer'), and a value no wait can use (NaN, 0, a string) is refused before Ray starts, as a bad
`poll_interval` is (NaN or 0 polled the replicas in a busy loop). On a real local Ray cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")

from radixcache.runtime.cluster.cluster import ReplicaCluster

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one Ray cluster at a time
ENGINE = {"capacity_blocks": 64, "page_size": 4}


# local_ray and tiny_dir: tests/cluster/conftest.py


@pytest.mark.parametrize("no_bound", [float("inf"), None])
def test_a_call_timeout_of_no_bound_serves(local_ray: str, tiny_dir: Path, no_bound: float | None) -> None:
    from radixcache.runtime.cluster.front import ClusterEngine

    cluster = ReplicaCluster(str(tiny_dir), 1, engine_kwargs=ENGINE, poll_interval=0.05, call_timeout=no_bound)
    engine = ClusterEngine(cluster, str(tiny_dir))
    try:
        direct = cluster.generate([5, 6, 7, 8, 9], 3, ignore_eos=True)
        streamed = engine.generate([5, 6, 7, 8, 9], 3, ignore_eos=True)
        assert direct.token_ids == streamed.token_ids and len(direct.token_ids) == 3
        assert engine.check(None)["locked_blocks"] == 0 and engine.flush(None)
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"call_timeout": float("nan")}, "call_timeout"),
        ({"call_timeout": 0}, "call_timeout"),
        ({"call_timeout": "600"}, "call_timeout"),
        ({"poll_interval": float("nan")}, "poll_interval"),
        ({"poll_interval": 0.0}, "poll_interval"),
    ],
)
def test_a_bound_no_wait_can_use_is_refused_before_ray(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, object], match: str
) -> None:
    import ray

    started: list[str] = []
    monkeypatch.setattr(ray, "init", lambda *_a, **_k: started.append("ray.init"))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(ValueError, match=match):
        ReplicaCluster("unused", 1, **kwargs)  # type: ignore[arg-type]
    assert started == []
