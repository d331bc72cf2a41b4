"""/metrics' counters behind replicas never go back: the front door summed the live replicas' EngineStats, so a
replica that died left the sum (radixcache_generation_tokens_total fell by its tokens, which Prometheus reads as a
counter reset: rate() counted the whole remaining total again), and one that Ray restarted counted from zero. Two
real replica engines in-process (tests/cluster/inproc_ray.py); every request generates TOKENS tokens, so the
generated-tokens counter must equal TOKENS times the requests answered, whichever replicas are alive."""

from __future__ import annotations

import sys

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
