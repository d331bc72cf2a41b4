"""Each routing policy's behaviour, pinned on hand-built clusters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from radixcache.router import (
    ROUTERS,
    CacheAwareRouter,
    EventBatch,
    LoadTracker,
    Router,
    RouteRequest,
    RouterError,
    RouterIndex,
    SGLangRouter,
    make_router,
)


def cluster(n: int, cached: dict[int, list] | None = None) -> RouterIndex:
    index = RouterIndex()
    for r in range(n):
        index.add_replica(r)
    for r, keys in (cached or {}).items():
        assert index.apply(EventBatch(r, 1, tuple(keys)))
    return index


def request(pages: int, prompt_tokens: int | None = None, session: str | None = None, first: int = 0) -> RouteRequest:
    """A request over page keys first .. first+pages-1, 16 tokens a page."""
    keys = list(range(first, first + pages))
    return RouteRequest(keys, prompt_tokens if prompt_tokens is not None else 16 * pages, 8, 16, session)


def busy(loads: LoadTracker, replica: int, prefill_tokens: float, requests: int = 1, tag: str = "") -> None:
    for i in range(requests):
        loads.dispatched(replica, f"{tag}{replica}-{i}-{prefill_tokens}", prefill_tokens / requests, 0)


def test_make_router_names_every_policy() -> None:
    assert ROUTERS == ("round_robin", "least_loaded", "power_of_two", "consistent_hash", "sglang", "cache_aware")
    for name in ROUTERS:
        router = make_router(name)
        assert isinstance(router, Router) and router.name == name
        with pytest.raises(RouterError):
            router.choose(request(1), [], cluster(0), LoadTracker())
    with pytest.raises(RouterError):
        make_router("nope")
    with pytest.raises(RouterError):
        make_router("round_robin", seed=1)
    with pytest.raises(RouterError):
        make_router("cache_aware", miss_weight=0.5)


def test_round_robin_cycles() -> None:
    router, index, loads = make_router("round_robin"), cluster(3, {0: [0, 1]}), LoadTracker()
    assert [router.choose(request(2), [0, 1, 2], index, loads) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_picks_the_least_work_in_tokens_not_requests() -> None:
    router, index, loads = make_router("least_loaded"), cluster(3), LoadTracker(prefill_cost=1.0, decode_cost=0.0)
    busy(loads, 0, 10_000)  # one long prefill
    busy(loads, 1, 50, requests=5)  # five short ones
    busy(loads, 2, 20_000)
    assert router.choose(request(1), [0, 1, 2], index, loads) == 1
    assert router.choose(request(1), [0, 2], index, loads) == 0


def test_power_of_two_is_seeded_and_takes_the_lighter_of_its_two() -> None:
    index, loads = cluster(8), LoadTracker(1.0, 0.0)
    for r in range(8):
        busy(loads, r, 100 * (8 - r))
    one, two = make_router("power_of_two", seed=3), make_router("power_of_two", seed=3)
    picks = [one.choose(request(1), list(range(8)), index, loads) for _ in range(50)]
    assert picks == [two.choose(request(1), list(range(8)), index, loads) for _ in range(50)]
    assert len(set(picks)) > 2  # it samples
    assert 0 not in picks  # the heaviest never wins: whichever replica it is drawn with is lighter
    two_replicas = make_router("power_of_two", seed=0)
    assert {two_replicas.choose(request(1), [3, 5], index, loads) for _ in range(20)} == {5}  # 5 is the lighter


def test_consistent_hash_is_stable_for_a_session_and_moves_few_keys_when_a_replica_goes() -> None:
    router, index, loads = make_router("consistent_hash"), cluster(8), LoadTracker()
    sessions = [f"user-{i}" for i in range(2000)]
    before = {
        s: router.choose(request(3, session=s, first=hash(s) % 1000), list(range(8)), index, loads) for s in sessions
    }
    again = {s: router.choose(request(5, session=s), list(range(8)), index, loads) for s in sessions}
    assert again == before  # the session decides, not the prompt
    assert len(set(before.values())) == 8
    after = {s: router.choose(request(3, session=s), [0, 1, 2, 4, 5, 6, 7], index, loads) for s in sessions}
    moved = [s for s in sessions if after[s] != before[s]]
    assert all(before[s] == 3 for s in moved)  # only the removed replica's sessions move
    assert len(moved) / len(sessions) < 0.2  # about 1/8 of them
    # without a session, the first pages decide: same prefix, same replica, whatever follows
    prefix = [
        router.choose(RouteRequest([1, 2, 3, 4, tail], 80, 8, 16), list(range(8)), index, loads) for tail in range(20)
    ]
    assert len(set(prefix)) == 1


def test_consistent_hash_takes_a_session_or_key_with_a_lone_surrogate() -> None:
    """Regression: a str with a lone surrogate (what JSON's "\\ud800" escape decodes to) raised UnicodeEncodeError
    from the router; it hashes now, to the same replica every time, and a valid str keeps its place on the ring."""
    from hashlib import blake2b

    from radixcache.router.consistent_hash import stable_bytes

    router, index, loads = make_router("consistent_hash"), cluster(8), LoadTracker()
    replicas = list(range(8))
    for hostile in (request(2, session="\ud800chat"), RouteRequest(["\udcff", "x"], 32, 8, 16)):
        chosen = router.choose(hostile, replicas, index, loads)
        assert chosen in replicas and router.choose(hostile, replicas, index, loads) == chosen
    assert stable_bytes("\udcff") == b"s\xed\xb3\xbf"
    assert stable_bytes("caf\u00e9") == b"s" + "caf\u00e9".encode()  # as before for every valid str
    point = int.from_bytes(blake2b(b"session\0user-7", digest_size=8).digest(), "little")
    assert router.choose(request(1, session="user-7"), replicas, index, loads) == router.owner(point, replicas)


def test_sglang_shortest_queue_when_imbalanced_in_requests() -> None:
    router, loads = SGLangRouter(), LoadTracker(1.0, 0.0)
    index = cluster(3, {0: list(range(10))})
    busy(loads, 0, 100, requests=100)
    busy(loads, 1, 10, requests=30)
    busy(loads, 2, 10, requests=20)
    # 100 - 20 > 64 and 100 > 1.5 * 20: imbalanced, so the shortest queue, though replica 0 holds the whole prompt
    assert router.branch(request(10), [0, 1, 2], index, loads) == "imbalanced"
    assert router.choose(request(10), [0, 1, 2], index, loads) == 2


def test_sglang_follows_the_cache_past_the_threshold_however_many_tokens_wait() -> None:
    router, loads = SGLangRouter(), LoadTracker(1.0, 0.0)
    index = cluster(2, {0: list(range(4))})
    busy(loads, 0, 1_000_000, requests=300)  # a huge backlog in tokens...
    busy(loads, 1, 10, requests=210)  # ...but 300 - 210 > 64 and 300 <= 1.5 * 210: balanced, in requests
    assert router.branch(request(10), [0, 1], index, loads) == "cache"  # 4 of 10 pages: 40% > 30%
    assert router.choose(request(10), [0, 1], index, loads) == 0


def test_sglang_sends_a_miss_to_the_smallest_tree_even_when_it_is_the_busiest() -> None:
    router, loads = SGLangRouter(in_flight=False), LoadTracker(1.0, 0.0)
    index = cluster(3, {0: list(range(2)), 1: list(range(100, 150)), 2: list(range(200, 260))})
    busy(loads, 0, 50_000, requests=3)  # the smallest tree, and by far the most work in tokens
    assert router.branch(request(10), [0, 1, 2], index, loads) == "smallest_tree"  # 2 of 10 pages: 20%
    assert router.choose(request(10), [0, 1, 2], index, loads) == 0


def test_cache_aware_picks_the_matching_replica_when_idle() -> None:
    router = CacheAwareRouter()
    index = cluster(4, {2: list(range(8)), 3: list(range(3))})
    assert router.choose(request(10), [0, 1, 2, 3], index, LoadTracker()) == 2
    scores = router.scores(request(10), [0, 1, 2, 3], index, LoadTracker(1.0, 0.0))
    assert [s.matched_pages for s in scores] == [0, 0, 8, 3]
    assert [s.expected_ttft_s for s in scores] == [160, 160, 32, 112]


def test_cache_aware_leaves_the_match_when_its_queue_makes_the_ttft_worse() -> None:
    index = cluster(2, {0: list(range(10))})  # replica 0 holds 160 of the prompt's 200 tokens
    request_ = request(10, prompt_tokens=200)
    loads = LoadTracker(1.0, 0.0)
    busy(loads, 0, 100)
    pure = CacheAwareRouter(miss_weight=1.0, balance=0.0)
    assert pure.choose(request_, [0, 1], index, loads) == 0  # 100 + 40 < 0 + 200
    busy(loads, 0, 200, tag="more")
    assert pure.choose(request_, [0, 1], index, loads) == 1  # 300 + 40 > 200
    # the default charges a recomputed prefill three times (it also delays the requests behind it): it stays
    assert CacheAwareRouter(balance=0.0).choose(request_, [0, 1], index, loads) == 0  # 300 + 3 * 40 < 3 * 200
    busy(loads, 0, 400, tag="even more")
    assert CacheAwareRouter(balance=0.0).choose(request_, [0, 1], index, loads) == 1  # 700 + 120 > 600


def test_cache_aware_sends_a_miss_to_the_least_loaded_not_the_smallest_tree() -> None:
    index = cluster(3, {0: [], 1: list(range(100, 200)), 2: list(range(300, 350))})
    loads = LoadTracker(1.0, 0.0)
    busy(loads, 0, 5_000)  # the smallest tree, but busy
    busy(loads, 2, 100)
    assert CacheAwareRouter().choose(request(10), [0, 1, 2], index, loads) == 1


def test_cache_aware_sessions_stick_within_the_slack() -> None:
    router = CacheAwareRouter(miss_weight=1.0, balance=0.0, session_slack=0.25, session_slack_s=0.0, in_flight=False)
    index, loads = cluster(2), LoadTracker(1.0, 0.0)
    assert router.choose(request(1, session="s"), [0, 1], index, loads) == 0  # idle: the lower id
    busy(loads, 0, 3)  # replica 0: 3 + 16 = 19 against 16: within 25% of the best, so the session stays
    assert router.choose(request(1, session="s"), [0, 1], index, loads) == 0
    assert router.choose(request(1, session="other"), [0, 1], index, loads) == 1  # no history: the best
    busy(loads, 0, 10, tag="x")  # 29 > 16 * 1.25: too slow, it moves
    assert router.choose(request(1, session="s"), [0, 1], index, loads) == 1
    assert router.choose(request(1, session="s"), [0, 1], index, loads) == 1  # and sticks to the new replica


def test_cache_aware_counts_prefixes_in_flight_until_they_finish() -> None:
    router, index, loads = CacheAwareRouter(balance=0.0), cluster(3), LoadTracker(1.0, 0.0)
    first = request(10, first=500)
    r = router.route(first, [0, 1, 2], index, loads)
    assert r == (0, 0)
    loads.dispatched(0, "first", 160, 0)
    second = request(12, first=500)  # the same 10 pages and 2 more
    r = router.route(second, [0, 1, 2], index, loads)
    assert r == (0, 10)  # behind the first, which will have cached its 10 pages
    loads.dispatched(0, "second", 32, 0)
    loads.finished(0, "first")
    loads.finished(0, "second")  # never published (say, evicted at once): the router forgets them
    assert router.route(request(10, first=500), [0, 1, 2], index, loads).matched_pages == 0
    blind = CacheAwareRouter(balance=0.0, in_flight=False)
    loads.dispatched(0, "third", 160, 0)
    assert blind.route(request(10, first=900), [0, 1, 2], index, loads).replica == 1


def test_cache_aware_rotates_among_exact_ties() -> None:
    router, index, loads = CacheAwareRouter(balance=0.0), cluster(3), LoadTracker()
    assert [router.choose(request(1), [0, 1, 2], index, loads) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_cache_aware_balance_places_new_work_on_replicas_that_took_less() -> None:
    router, index, loads = CacheAwareRouter(balance=1.0, balance_horizon=64), cluster(2), LoadTracker(1.0, 0.0)
    busy(loads, 1, 10_000, tag="long")  # replica 1 is busy with a long prefill...
    for i in range(3):  # ...so replica 0 takes the next requests
        assert router.route(request(10, first=100 * i), [0, 1], index, loads).replica == 0
    loads.finished(1, "long1-0-10000")
    busy(loads, 1, 50)  # replica 1 is a little busy now, replica 0 idle
    # by TTFT alone replica 0 wins (160 against 50 + 160); it took 3 * 160 of work lately and replica 1 none
    assert router.choose(request(10), [0, 1], index, loads) == 1
    assert CacheAwareRouter(balance=0.0).choose(request(10), [0, 1], index, loads) == 0


def test_a_replica_that_rejoins_draws_no_conversation_from_an_idle_replica_holding_it() -> None:
    """Regression: a replica the router had no recent work for (it came back after a death, or joined) counted 0
    against the others' whole history, so the balance term sent it every request it could: a conversation whose
    history an idle replica holds was recomputed on the empty one. It starts at the others' mean: misses still go to
    it (idle, never chosen), and conversations stay where their history is."""
    router, loads = CacheAwareRouter(), LoadTracker(1.0, 0.0)
    index = cluster(2, {0: list(range(9))})  # replica 0 holds 9 of the conversation's 10 pages
    for i in range(20):  # replica 1 was away: replica 0 alone took the last 20 requests
        router.route(request(10, first=100 * (i + 1)), [0], index, loads)
    router.forget(1)
    assert router.choose(request(10), [0, 1], index, loads) == 0  # 16 tokens to prefill against 160, both idle
    assert router.choose(request(10, first=5_000), [0, 1], index, loads) == 1  # a miss: the idle one never chosen
    assert CacheAwareRouter(balance=0.0).choose(request(10), [0, 1], index, loads) == 0


def test_cache_aware_forget_drops_a_dead_replicas_state() -> None:
    router, index, loads = CacheAwareRouter(), cluster(2), LoadTracker()
    router.choose(request(2, session="s"), [0, 1], index, loads)
    router.forget(0)
    assert router.choose(request(2, session="s"), [1], index, loads) == 1


@pytest.mark.parametrize("make", [lambda: CacheAwareRouter(balance=0.0), lambda: SGLangRouter()])
def test_in_flight_prefixes_leave_with_their_own_request_out_of_order(make) -> None:
    """Regression: the in-flight record kept the last `running` routed prefixes, assuming FIFO completion. When a
    later request finished while an earlier one still ran, the earlier one's prefix went and the later one's stayed."""
    router, index, loads = make(), cluster(2), LoadTracker(1.0, 0.0)
    long, short = request(10, first=500), request(10, first=900)
    for rid, req in (("long", long), ("short", short)):
        r = router.route(replace(req, rid=rid), [0], index, loads)
        loads.dispatched(r.replica, rid, 160, 0)
    loads.finished(0, "short")  # routed second, finished first
    assert router.route(replace(short, rid="probe1"), [0], index, loads).matched_pages == 0
    assert router.route(replace(long, rid="probe2"), [0], index, loads).matched_pages == 10
    loads.finished(0, "long")  # failed or cancelled: its prefix goes too
    assert router.route(replace(long, rid="probe3"), [0], index, loads).matched_pages == 0


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("cache_aware", {"miss_weight": float("inf")}),
        ("cache_aware", {"balance": float("inf")}),
        ("cache_aware", {"session_slack": float("inf")}),
        ("sglang", {"balance_abs": float("nan")}),
        ("sglang", {"balance_rel": float("nan")}),
        ("sglang", {"balance_rel": float("inf")}),
    ],
)
def test_a_non_finite_router_parameter_is_refused(name: str, params: dict[str, float]) -> None:
    """Regression: cache_aware took an infinite miss_weight or balance, whose inf * 0 made a replica's score NaN, so
    it sent a request away from the replica holding its whole prompt; sglang took NaN bounds that never matched."""
    with pytest.raises(RouterError, match="finite"):
        make_router(name, **params)


@pytest.mark.parametrize(
    ("name", "params", "named"),
    [
        ("cache_aware", {"in_flight": "no"}, "cache_aware: in_flight must be True or False"),  # truthy: tracked
        ("sglang", {"in_flight": 0}, "sglang: in_flight must be True or False"),
        ("sglang", {"balance_abs": True}, "must be numbers"),  # taken for 1
        ("sglang", {"cache_threshold": "0.5"}, "must be numbers"),  # a TypeError from the comparison
        ("power_of_two", {"seed": True}, "power_of_two: seed must be an int"),  # random.Random(True): seed 1
        ("power_of_two", {"seed": "7"}, "power_of_two: seed must be an int"),  # a str seeds, silently
    ],
)
def test_a_router_parameter_of_the_wrong_type_is_refused(name: str, params: dict, named: str) -> None:
    with pytest.raises(RouterError, match=named):
        make_router(name, **params)
    assert make_router(name) is not None


def test_in_flight_prefixes_refuse_a_negative_bound() -> None:
    """Regression: a negative max_per_replica failed the first `add` with an IndexError (pop from an empty deque)."""
    from radixcache.router.inflight import InFlightPrefixes

    with pytest.raises(RouterError, match="max_per_replica"):
        InFlightPrefixes(max_per_replica=-1)
    untracked = InFlightPrefixes(max_per_replica=0)  # 0 keeps nothing in flight
    untracked.add(0, (1, 2), "a")
    assert untracked.matched_pages(0, (1, 2)) == 0


def test_consistent_hash_bounds_its_ring_and_names_an_empty_one() -> None:
    """vnodes=10**9 was taken and built a ring of a billion points a replica on the first choice (out of memory);
    `owner` of no replicas raised ZeroDivisionError."""
    from radixcache.router.consistent_hash import MAX_VNODES, ConsistentHashRouter
    from radixcache.router.errors import RouterError

    with pytest.raises(RouterError, match="vnodes must be at most"):
        ConsistentHashRouter(vnodes=MAX_VNODES + 1)
    router = ConsistentHashRouter(vnodes=MAX_VNODES)
    assert router.owner(12345, [0, 1]) in (0, 1)
    with pytest.raises(RouterError, match="no replicas"):
        router.owner(12345, [])
