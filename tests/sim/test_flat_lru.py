"""LRU over single blocks (radixcache.sim.flat_lru) gives the tree's figures, field for field, chunk by chunk
or all at once; a trace it cannot replay goes to the tree. The infinite bound matched in chunks
(radixcache.sim.infinite_ids) gives the per-request figures and a naive reference's."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.sim.cache_replay import CacheReplay
from radixcache.sim.evaluation import evaluate
from radixcache.sim.flat_lru import FlatLRUReplay
from radixcache.sim.infinite_replay import InfiniteReplay
from radixcache.sim.replay_common import drive, trace_span
from radixcache.sim.simulation import device_replay, replay_result, simulate
from radixcache.sim.source import open_source
from radixcache.sim.timeline import Timeline
from radixcache.trace import HashRequest
from radixcache.trace.workload import hash_workload, load_workload
from tests.sim.conftest import MOONCAKE_TRACE
from tests.sim.test_flat_replay import chained_traces, figures, recorded_mid_trace


def flat_lru(workload: object, capacity: int, chunk_ids: int, *, windows: int = 20) -> FlatLRUReplay:
    """A flat LRU replay of `workload` in chunks of at least `chunk_ids` ids, driven to the end."""
    replay = FlatLRUReplay(
        workload,
        capacity,
        timeline=Timeline(windows, trace_span(workload)),  # type: ignore[arg-type]
        honor_timestamps=False,
        chunk_ids=chunk_ids,
    )
    drive(workload, [replay], None)  # type: ignore[arg-type]
    return replay


def tree_lru(workload: object, capacity: int, **kw: object) -> dict:
    return figures(simulate(workload, capacity, "lru", flat=False, **kw))  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)  # was 300 before the fast test path (issue 30)
@given(chained_traces(), st.integers(1, 24), st.sampled_from([1, 3, 16, 1 << 14]))
def test_flat_lru_gives_the_trees_figures(trace: list[HashRequest], capacity: int, chunk_ids: int) -> None:
    """Chunks of one request each, of a few, and the whole trace in one: every figure is the tree's, oversized
    requests (longer than the cache) and partial last blocks included."""
    workload = hash_workload(trace, block_size=4)
    replay = flat_lru(workload, capacity, chunk_ids, windows=3)
    assert not replay.broken
    assert figures(replay_result(replay)) == tree_lru(workload, capacity, windows=3)


@settings(max_examples=60, deadline=None)
@given(chained_traces(), st.integers(1, 24), st.booleans())
def test_simulate_and_evaluate_replay_lru_flat_with_the_trees_figures(
    trace: list[HashRequest], capacity: int, honor: bool
) -> None:
    workload = hash_workload(trace, block_size=4)
    assert isinstance(device_replay(workload, capacity, "lru"), FlatLRUReplay)
    flat = simulate(workload, capacity, "lru", honor_timestamps=honor, windows=3)
    assert figures(flat) == tree_lru(workload, capacity, honor_timestamps=honor, windows=3)
    report, tree = (evaluate(workload, capacity, "lru", windows=3, flat=f) for f in (True, False))
    assert figures(report.result) == figures(tree.result)
    assert figures(report.infinite) == figures(tree.infinite)  # type: ignore[arg-type]


@pytest.mark.skipif(not MOONCAKE_TRACE.exists(), reason="needs ../shared/traces")
@pytest.mark.parametrize("capacity", [439, 4392, 30747])
def test_flat_lru_on_the_shared_trace_streamed_and_in_memory(capacity: int) -> None:
    workload = load_workload(str(MOONCAKE_TRACE))
    tree = tree_lru(workload, capacity)
    assert figures(simulate(workload, capacity, "lru")) == tree
    assert figures(simulate(open_source(MOONCAKE_TRACE), capacity, "lru")) == tree
    small_chunks = flat_lru(open_source(MOONCAKE_TRACE), capacity, 1000)
    assert figures(replay_result(small_chunks)) == tree


def unchained_late() -> list[HashRequest]:
    """Chained for 30 requests (several chunks of 8 ids), then id 2 after parent 7 while it is cached after 1."""
    trace = [HashRequest(i, 12, 1, (1, 2, 100 + i)) for i in range(30)]
    return [*trace, HashRequest(30, 8, 1, (7, 2)), HashRequest(31, 12, 1, (1, 2, 100))]


@pytest.mark.parametrize(
    ("trace", "why"),
    [
        ([HashRequest(0, 8, 1, (1, 2)), HashRequest(1, 8, 1, (5, 2))], "two different parents"),
        ([HashRequest(0, 8, 1, (1, 2)), HashRequest(1, 12, 1, (1, 2, 1))], "twice in one request"),
        ([HashRequest(0, 8, 1, (3, 4)), HashRequest(1, 12, 1, (1, 2, 1))], "twice in one request"),
        (unchained_late(), "two different parents"),
    ],
)
def test_ids_that_are_not_chained_break_the_flat_replay_and_the_tree_replays_them(
    trace: list[HashRequest], why: str
) -> None:
    workload = hash_workload(trace, block_size=4)
    for chunk_ids in (1, 8, 1 << 14):
        replay = flat_lru(workload, 3, chunk_ids)
        assert replay.broken and why in replay.reason
    tree = tree_lru(workload, 3)
    assert figures(simulate(workload, 3, "lru")) == tree
    assert figures(evaluate(workload, 3, "lru").result) == tree


def test_a_recorded_request_mid_trace_sends_lru_to_the_tree(tmp_path: Path) -> None:
    source = recorded_mid_trace(tmp_path)
    replay = flat_lru(source, 3, 1)
    assert replay.broken and "recorded" in replay.reason
    tree = tree_lru(source, 3)
    assert figures(simulate(source, 3, "lru")) == tree
    assert figures(evaluate(source, 3, "lru").result) == tree


def test_what_keeps_the_tree_for_lru() -> None:
    chained = hash_workload([HashRequest(0, 8, 1, (1, 2)), HashRequest(1, 8, 1, (1, 3))], block_size=4)
    assert isinstance(device_replay(chained, 4, "lru", concurrency=2), CacheReplay)
    assert isinstance(device_replay(chained, 4, "lru", check=True), CacheReplay)
    assert isinstance(device_replay(chained, 4, "lru", admission="all"), CacheReplay)
    assert isinstance(device_replay(chained, 4, "lru", flat=False), CacheReplay)
    assert isinstance(device_replay(chained, 4, "fifo"), CacheReplay)
    tokens = load_workload_from_tokens()
    assert isinstance(device_replay(tokens, 4, "lru"), CacheReplay)


def load_workload_from_tokens() -> object:
    from radixcache.trace.workload import SimRequest, Workload

    request = SimRequest(0.0, (1, 2, 3), (), 3)
    return Workload((request,), page_size=1, block_tokens=1, kind="token")


# ---------------------------------------------------------------------------------------------- the infinite bound


def naive_infinite_hits(trace: list[HashRequest]) -> list[int]:
    """Each request's hit (in ids): its longest prefix some earlier request read, by tuples of ids."""
    seen: set[tuple[int, ...]] = set()
    hits = []
    for request in trace:
        ids = tuple(request.hash_ids)
        hit = 0
        while hit < len(ids) and ids[: hit + 1] in seen:
            hit += 1
        hits.append(hit)
        seen.update(ids[:k] for k in range(1, len(ids) + 1))
    return hits


def infinite(workload: object, chunk_ids: int | None) -> InfiniteReplay:
    replay = InfiniteReplay(workload, windows=3, chunk_ids=chunk_ids)  # type: ignore[arg-type]
    drive(workload, [replay], None)  # type: ignore[arg-type]
    return replay


@settings(max_examples=80, deadline=None)
@given(chained_traces(), st.sampled_from([1, 3, 16, 1 << 15]))
def test_the_chunked_infinite_bound_gives_the_per_request_figures(trace: list[HashRequest], chunk_ids: int) -> None:
    workload = hash_workload(trace, block_size=4)
    chunked, one_by_one = infinite(workload, chunk_ids), infinite(workload, None)
    assert not chunked.broken and not one_by_one.broken
    assert figures(chunked.result()) == figures(one_by_one.result())
    assert chunked.hit_blocks == sum(naive_infinite_hits(trace))


@pytest.mark.parametrize(
    "trace",
    [
        [HashRequest(0, 8, 1, (1, 2)), HashRequest(1, 8, 1, (5, 2))],
        [HashRequest(0, 12, 1, (1, 2, 1))],
        unchained_late(),
    ],
)
def test_the_chunked_infinite_bound_breaks_where_the_per_request_one_does(trace: list[HashRequest]) -> None:
    workload = hash_workload(trace, block_size=4)
    for chunk_ids in (1, 8, 1 << 15):
        assert infinite(workload, chunk_ids).broken
    assert infinite(workload, None).broken
    # evaluate then replays the bound by sequence: the naive reference's hits
    assert evaluate(workload, 3, "lru").infinite.hit_blocks == sum(naive_infinite_hits(trace))  # type: ignore[union-attr]


@pytest.mark.parametrize("capacity", [2.7, float("inf"), True, "5"])
@pytest.mark.parametrize("policy", ["lru", "belady"])
def test_a_capacity_that_is_not_a_positive_int_is_refused_on_a_hash_trace_too(capacity: object, policy: str) -> None:
    """Regression: a hash trace's flat LRU replay took the capacity as it came: 2.7 or inf was a numpy TypeError,
    True a 1-block cache and "5" a TypeError, where every other replay raises RadixCacheError naming it."""
    from radixcache.errors import RadixCacheError

    workload = hash_workload([HashRequest(float(i), 8, 1, (i % 2, 10 + i % 3)) for i in range(10)], block_size=4)
    with pytest.raises(RadixCacheError, match=f"capacity_blocks must be a positive int, got {capacity!r}"):
        simulate(workload, capacity, policy)  # type: ignore[arg-type]
    with pytest.raises(RadixCacheError, match="concurrency must be a positive int, got True"):
        simulate(workload, 4, policy, concurrency=True)  # was taken for 1 by the flat replays


def test_a_capacity_past_int64_replays_a_hash_trace_as_any_capacity_nothing_fills() -> None:
    """Regression: past int64 the flat LRU replay raised OverflowError; it runs on the tree now, as Belady did."""
    workload = hash_workload([HashRequest(float(i), 8, 1, (i % 2, 10 + i % 3)) for i in range(10)], block_size=4)
    roomy = figures(simulate(workload, 100, "lru"))
    for capacity in (2**63 - 1, 2**70):
        assert {k: v for k, v in figures(simulate(workload, capacity, "lru")).items() if k != "capacity_blocks"} == {
            k: v for k, v in roomy.items() if k != "capacity_blocks"
        }


def test_windows_of_requests_past_a_float_s_exact_integers_count_every_token_as_the_tree_does() -> None:
    """Blocks of 2**62 tokens (a hash trace's lines may give any block_size): the flat replay summed each window's
    tokens in float64 and was a few tokens off the tree's (13,835,058,055,282,163,712 prompt tokens against
    ...718), while the totals agreed."""
    size = 2**62
    requests = [HashRequest(float(i), size + 1 + i, 1, (1, 2 + i % 2), block_size=size) for i in range(6)]
    workload = hash_workload(requests, size)
    flat = simulate(workload, 10, "lru", windows=2)
    tree = simulate(workload, 10, "lru", windows=2, flat=False)
    expected = [(3, sum(size + 1 + i for i in part)) for part in (range(3), range(3, 6))]
    assert [(w.requests, w.prompt_tokens) for w in tree.windows] == expected
    assert flat.windows == tree.windows
