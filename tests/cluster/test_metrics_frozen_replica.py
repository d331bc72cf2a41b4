"""/metrics behind replicas while one is frozen (alive to Ray, answering no call): it answered 503 for as long as
the replica stayed frozen (the stats read failed as a whole once one replica had not answered within its bound),
so a scraper lost every healthy replica's figures exactly when they mattered. It answers now with the answering
replicas' gauges, the frozen one's counters as last read (counters never go back) and radixcache_replica_up 0 for
it. Two real replica engines in-process (tests/cluster/inproc_ray.py); replica 0's stats call blocks until the test
lets it go; every request generates TOKENS tokens, so the generated-tokens counter is TOKENS times the requests."""

from __future__ import annotations

import re
import sys
import threading

import pytest
from fastapi.testclient import TestClient

from tests.cluster.inproc_front import inproc_front

ENGINE = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64"}
TOKENS = 3


def _scrape(client: TestClient) -> dict[str, float]:
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    out = {}
    for line in r.text.splitlines():
        m = re.match(r'(radixcache_\w+)\{model="tiny"(?:,replica="(\d)")?\} (\S+)$', line)
        if m:
            out[m[1] + ("" if m[2] is None else m[2])] = float(m[3])
    return out


def test_metrics_answer_with_the_live_replicas_while_one_is_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixcache.runtime.cluster import fanout
    from radixcache.runtime.server import create_app

    monkeypatch.setattr(fanout, "READ_WAIT_S", 0.3)  # a scrape's bound on a frozen replica (5 s as shipped)
    with inproc_front(monkeypatch, 2, "round_robin", ENGINE) as front:
        ray = sys.modules["ray"]
        replica0 = ray.actors[0].obj
        thawed = threading.Event()
        counted = replica0.counted_stats
        with TestClient(create_app(front, "tiny", public_metrics=True)) as client:
            for i in range(3):  # round robin: replicas 0, 1, 0
                assert len(front.generate([5, 6, 7, i + 1], TOKENS, ignore_eos=True).token_ids) == TOKENS
            before = _scrape(client)
            assert before["radixcache_generation_tokens_total"] == TOKENS * 3
            assert (before["radixcache_replica_up0"], before["radixcache_replica_up1"]) == (1, 1)
            assert before["radixcache_kv_blocks_capacity"] == 2 * front.replicas[1].stats.capacity_blocks

            replica0.counted_stats = lambda: (thawed.wait(30), counted())[1]  # frozen: answers no stats read
            assert len(front.generate([5, 6, 7, 9], TOKENS, ignore_eos=True).token_ids) == TOKENS  # on replica 1
            during = _scrape(client)
            assert (during["radixcache_replica_up0"], during["radixcache_replica_up1"]) == (0, 1)
            assert during["radixcache_generation_tokens_total"] == TOKENS * 4  # replica 0's 6 as last read, never less
            assert during["radixcache_engine_requests_total"] == 4
            assert during["radixcache_kv_blocks_capacity"] == front.replicas[1].stats.capacity_blocks  # the live one's
            assert front.cluster.alive == (0, 1)  # slow is not dead

            thawed.set()
            after = _scrape(client)
            assert (after["radixcache_replica_up0"], after["radixcache_replica_up1"]) == (1, 1)
            assert after["radixcache_generation_tokens_total"] == TOKENS * 4
        replica0.counted_stats = counted
