"""Belady over single blocks (radixcache.sim.flat) gives the tree's figures, field for field, and the
simulator uses it only where it does."""

from __future__ import annotations

import json
import random
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.sim.cache_replay import CacheReplay
from radixcache.sim.evaluation import evaluate
from radixcache.sim.flat import FlatBeladyReplay
from radixcache.sim.results import SimResult
from radixcache.sim.simulation import device_replay, simulate
from radixcache.sim.source import TraceSource, open_source
from radixcache.trace import HashRequest
from radixcache.trace.workload import hash_workload, load_workload
from tests.sim.conftest import MOONCAKE_TRACE
from tests.sim.test_belady import brute_force_hits, random_paths


def figures(result: SimResult) -> dict:
    """Every field but the time the replay took."""
    return {f.name: getattr(result, f.name) for f in fields(result) if f.name != "seconds"}


def flat_and_tree(workload: object, capacity: int, **kw: object) -> tuple[dict, dict]:
    flat = simulate(workload, capacity, "belady", flat=True, **kw)  # type: ignore[arg-type]
    tree = simulate(workload, capacity, "belady", flat=False, **kw)  # type: ignore[arg-type]
    return figures(flat), figures(tree)


@st.composite
def chained_traces(draw: st.DrawFn) -> list[HashRequest]:
    """Sessions that extend their own history on a few shared prefixes: chained ids, with partial last blocks,
    repeats, bursts of equal timestamps, and requests longer than small caches."""
    block = 4
    prefixes = [tuple(range(1000 * p, 1000 * p + draw(st.integers(0, 3)))) for p in range(draw(st.integers(1, 3)))]
    histories: list[tuple[int, ...]] = []
    fresh = iter(range(10**6, 10**7))
    out = []
    t = 0.0
    for _ in range(draw(st.integers(1, 40))):
        if histories and draw(st.booleans()):
            i = draw(st.integers(0, len(histories) - 1))
            ids = histories[i] + tuple(next(fresh) for _ in range(draw(st.integers(0, 3))))
            histories[i] = ids
        else:
            ids = draw(st.sampled_from(prefixes)) + tuple(next(fresh) for _ in range(draw(st.integers(0, 4))))
            histories.append(ids)
        t += draw(st.sampled_from([0.0, 0.5, 3.0]))
        tokens = max(0, len(ids) * block - draw(st.integers(0, block - 1))) if ids else 0
        out.append(HashRequest(t, tokens, draw(st.integers(0, 50)), ids))
    return out


@settings(max_examples=100, deadline=None)  # was 300 before the fast test path (issue 30)
@given(chained_traces(), st.integers(1, 24), st.booleans())
def test_flat_belady_gives_the_trees_figures(trace: list[HashRequest], capacity: int, honor: bool) -> None:
    workload = hash_workload(trace, block_size=4)
    flat, tree = flat_and_tree(workload, capacity, honor_timestamps=honor, windows=3)
    assert flat == tree


@pytest.mark.parametrize("seed", range(40))
def test_flat_belady_equals_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    paths = random_paths(rng, rng.randint(4, 9))
    capacity = rng.randint(4, 6)
    trace = [HashRequest(i, 4 * len(p), 1, p) for i, p in enumerate(paths)]
    workload = hash_workload(trace, block_size=4)
    assert isinstance(device_replay(workload, capacity, "belady"), FlatBeladyReplay)
    assert simulate(workload, capacity, "belady").hit_blocks == brute_force_hits(paths, capacity)


@pytest.mark.skipif(not MOONCAKE_TRACE.exists(), reason="needs ../shared/traces")
@pytest.mark.parametrize("capacity", [439, 4392, 30747])
def test_flat_belady_on_the_shared_trace_streamed_and_in_memory(capacity: int) -> None:
    workload = load_workload(str(MOONCAKE_TRACE))
    flat, tree = flat_and_tree(workload, capacity)
    assert flat == tree
    assert figures(simulate(open_source(MOONCAKE_TRACE), capacity, "belady")) == tree


def test_the_tree_runs_what_the_flat_replay_cannot() -> None:
    """Ids after two parents, requests in flight, admission and checks keep the tree; so does any policy but
    Belady and LRU named by their strings (LRU's flat replay: tests/sim/test_flat_lru.py)."""
    chained = hash_workload([HashRequest(0, 8, 1, (1, 2)), HashRequest(1, 8, 1, (1, 3))], block_size=4)
    unchained = hash_workload([HashRequest(0, 8, 1, (1, 2)), HashRequest(1, 8, 1, (5, 2))], block_size=4)
    assert isinstance(device_replay(chained, 4, "belady"), FlatBeladyReplay)
    assert isinstance(device_replay(unchained, 4, "belady"), CacheReplay)
    assert isinstance(device_replay(chained, 4, "belady", concurrency=2), CacheReplay)
    assert isinstance(device_replay(chained, 4, "belady", check=True), CacheReplay)
    assert isinstance(device_replay(chained, 4, "belady", flat=False), CacheReplay)
    assert isinstance(device_replay(chained, 4, "fifo"), CacheReplay)
    flat, tree = flat_and_tree(unchained, 3)
    assert flat == tree


def recorded_mid_trace(tmp_path: Path) -> TraceSource:
    """A hash trace (block size 4) whose third request an engine recorded (it has a finish time)."""
    path = tmp_path / "mixed.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 8, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 1, "input_length": 12, "output_length": 1, "hash_ids": [1, 2, 3]},
        {"timestamp": 2, "input_length": 8, "output_length": 1, "hash_ids": [1, 4], "finish_timestamp": 9},
        {"timestamp": 3, "input_length": 12, "output_length": 1, "hash_ids": [1, 2, 3]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return open_source(path, block_size=4)


def test_a_trace_with_a_recorded_request_keeps_the_tree(tmp_path: Path) -> None:
    """A request with a finish time (one an engine recorded) mid-trace: the tree replays the trace, flat or not."""
    source = recorded_mid_trace(tmp_path)
    assert isinstance(device_replay(source, 3, "belady"), CacheReplay)
    flat, tree = flat_and_tree(source, 3)
    assert flat == tree
    report = evaluate(source, 3, "lru", belady=True)
    assert figures(report.belady) == tree  # type: ignore[arg-type]


def test_belady_as_the_policy_of_evaluate_replays_flat_beside_the_infinite_bound() -> None:
    trace = [HashRequest(i, 8 + 4 * (i % 3), 1, (1, 2, *range(10 + i, 10 + i + i % 3))) for i in range(30)]
    workload = hash_workload(trace, block_size=4)
    flat = evaluate(workload, 5, "belady")
    tree = evaluate(workload, 5, "belady", flat=False)
    assert figures(flat.result) == figures(tree.result)
    assert figures(flat.infinite) == figures(tree.infinite)  # type: ignore[arg-type]


def test_a_trace_whose_heap_entries_would_overflow_int64_keeps_the_tree() -> None:
    import numpy as np

    from radixcache.sim.flat import _entries_fit
    from radixcache.sim.oracle import ChainedArrays

    def arrays(page: int, never: int) -> ChainedArrays:
        one = np.array([page], dtype=np.int64)
        return ChainedArrays(np.array([0, 1], dtype=np.int64), one, np.array([never], dtype=np.int64), never)

    assert _entries_fit(arrays(10**6, 10**6))
    assert not _entries_fit(arrays(2**40, 2**30))
