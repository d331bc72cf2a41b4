"""/metrics' counters behind replicas never go back: the front door summed the live replicas' EngineStats, so a
replica that died left the sum (radixcache_generation_tokens_total fell by its tokens, which Prometheus reads as a
counter reset: rate() counted the whole remaining total again), and one that Ray restarted counted from zero. Two
real replica engines in-process (tests/cluster/inproc_ray.py); every request generates TOKENS tokens, so the
generated-tokens counter must equal TOKENS times the requests answered, whichever replicas are alive."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.cluster.inproc_front import inproc_front

ENGINE = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64"}
TOKENS = 3


def test_counters_keep_a_dead_and_a_restarted_replica_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixcache.runtime.cluster.replica import EngineReplica

    with inproc_front(monkeypatch, 2, "round_robin", ENGINE) as front:
        ray = sys.modules["ray"]
        answered = 0

        def run(n: int) -> None:
            nonlocal answered
            for i in range(n):
                assert len(front.generate([5, 6, 7, answered + i + 1], TOKENS, ignore_eos=True).token_ids) == TOKENS
            answered += n

        run(4)  # round robin: two on each replica
        assert front.stats.generated_tokens == TOKENS * 4
        model = front.replicas[0]
        ray.kill(ray.actors[0])
        run(1)  # on replica 1; replica 0's 6 tokens stay counted
        stats = front.stats
        assert (stats.generated_tokens, stats.requests) == (TOKENS * 5, 5)
        assert stats.capacity_blocks == front.replicas[1].stats.capacity_blocks  # gauges: the live replica's
        # Ray restarts replica 0: a new process (incarnation) with an empty engine, which rejoins at the next poll.
        ray.actors[0].obj = EngineReplica(0, model.model, ENGINE, 1)
        ray.actors[0].dead = False
        front.cluster.poll()
        assert front.cluster.alive == (0, 1)
        run(2)  # one on each
        stats = front.stats
        assert (stats.generated_tokens, stats.requests) == (TOKENS * 7, 7)
        assert stats.capacity_blocks == 2 * front.replicas[1].stats.capacity_blocks


def _stats(requests: int) -> Any:
    from radixcache import CacheStats
    from radixcache.runtime.engine.stats import EngineStats

    return EngineStats(requests, 0, 0, 0, TOKENS * requests, 64, 64, 0, 0, CacheStats(queries=requests))


def test_two_scrapes_at_once_never_take_a_count_back() -> None:
    """Two /metrics scrapes at once (two Prometheus servers) each ask the replicas, then apply their answers under a
    lock, in either order: the one that asked first and applied last took the counts back to its older answers, and
    an answer from a replica's process that Ray had since replaced counted that process's counts twice."""
    from radixcache.runtime.cluster.tally import Counters

    counters = Counters()
    assert counters.total({0: ("i0", _stats(3)), 1: ("j0", _stats(4))}).requests == 7
    newer = counters.total({0: ("i0", _stats(5)), 1: ("j0", _stats(4))})
    assert (newer.requests, newer.generated_tokens, newer.cache.queries) == (9, TOKENS * 9, 9)
    older = counters.total({0: ("i0", _stats(4)), 1: ("j0", _stats(4))})  # asked before the one above
    assert (older.requests, older.generated_tokens, older.cache.queries) == (9, TOKENS * 9, 9)
    restarted = counters.total({0: ("i1", _stats(1)), 1: ("j0", _stats(6))})  # replica 0 is a new process now
    assert restarted.requests == 5 + 1 + 6
    stale = counters.total({0: ("i0", _stats(5)), 1: ("j0", _stats(6))})  # asked before the restart was seen
    assert stale.requests == 5 + 1 + 6
