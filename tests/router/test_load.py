"""LoadTracker counts load in tokens of work; RouteRequest says what a request needs."""

from __future__ import annotations

import pytest

from radixcache.router import (
    DEFAULT_DECODE_COST,
    DEFAULT_PREFILL_COST,
    LoadTracker,
    ReplicaLoad,
    RouteRequest,
    RouterError,
)
from radixcache.sim.routing_results import DEFAULT_ROUTING_COSTS
from radixcache.sim.tiers import DEFAULT_TIER_COSTS


def test_work_is_pending_tokens_weighed_by_their_costs() -> None:
    loads = LoadTracker(prefill_cost=2.0, decode_cost=0.5)
    loads.dispatched(0, "a", 100, 10)
    loads.dispatched(0, "b", 50, 20)
    assert loads.load(0) == ReplicaLoad(150, 30, 2)
    assert loads.work(0) == 150 * 2.0 + 30 * 0.5
    assert loads.prefill_done(0, "a")
    assert not loads.prefill_done(0, "a")  # once
    assert loads.load(0) == ReplicaLoad(50, 30, 2)
    assert loads.finished(0, "a")
    assert loads.load(0) == ReplicaLoad(50, 20, 1)
    assert loads.finished(0, "b")
    assert loads.load(0) == ReplicaLoad(0.0, 0.0, 0) and loads.work(0) == 0.0
    assert not loads.finished(0, "b")
    assert loads.load(7) == ReplicaLoad(0.0, 0.0, 0)  # never dispatched to


def test_started_replaces_the_dispatch_estimate() -> None:
    loads = LoadTracker(1.0, 0.0)
    loads.dispatched(1, "r", 1000, 5)
    assert loads.started(1, "r", 200)  # the replica hit 800 tokens of its cache
    assert loads.load(1).pending_prefill_tokens == 200
    loads.prefill_done(1, "r")
    assert not loads.started(1, "r", 10)  # nothing left to revise


def test_started_revises_a_request_dispatched_as_a_full_hit() -> None:
    """Regression: a request dispatched with 0 prefill tokens (the router expected its whole prompt cached) read as
    one whose prefill was done, so when the replica found its pages evicted and reported 300 tokens to compute,
    `started` refused and the replica's load left them out until the request finished."""
    loads = LoadTracker(1.0, 0.0)
    loads.dispatched(0, "r", 0, 5)
    assert loads.started(0, "r", 300)
    assert loads.load(0) == ReplicaLoad(300, 5, 1) and loads.work(0) == 300
    assert loads.prefill_done(0, "r")
    assert loads.load(0) == ReplicaLoad(0, 5, 1)
    assert not loads.started(0, "r", 10) and not loads.prefill_done(0, "r")  # done is done
    loads.dispatched(0, "s", 0, 0)
    assert loads.prefill_done(0, "s") and not loads.started(0, "s", 10)


def test_a_request_id_is_in_flight_once_and_on_one_replica() -> None:
    loads = LoadTracker()
    loads.dispatched(0, 1, 10, 10)
    with pytest.raises(RouterError):
        loads.dispatched(1, 1, 10, 10)
    with pytest.raises(RouterError):
        loads.finished(1, 1)
    with pytest.raises(RouterError):
        loads.dispatched(0, 2, -1, 0)
    assert loads.in_flight() == 1


def test_float_rounding_never_leaves_an_idle_replica_busy() -> None:
    loads = LoadTracker()
    for i in range(100):
        loads.dispatched(0, i, 0.1, 0.3)
    for i in range(100):
        loads.finished(0, i)
    assert loads.load(0) == ReplicaLoad(0.0, 0.0, 0)


def test_remove_replica_drops_its_requests() -> None:
    loads = LoadTracker()
    loads.dispatched(0, "a", 1, 1)
    loads.dispatched(1, "b", 1, 1)
    assert loads.remove_replica(0) == 1
    assert loads.running(0) == 0 and loads.running(1) == 1
    assert not loads.finished(0, "a")


def test_default_costs_are_the_simulators() -> None:
    assert pytest.approx(DEFAULT_TIER_COSTS.prefill_ms_per_token) == DEFAULT_PREFILL_COST * 1000
    assert pytest.approx(DEFAULT_ROUTING_COSTS.prefill_ms_per_token) == DEFAULT_PREFILL_COST * 1000
    assert pytest.approx(DEFAULT_ROUTING_COSTS.decode_ms_per_token) == DEFAULT_DECODE_COST * 1000
    with pytest.raises(RouterError):
        LoadTracker(prefill_cost=float("nan"))


def test_route_request_counts_uncached_tokens() -> None:
    request = RouteRequest((1, 2, 3), prompt_tokens=40, max_tokens=8, page_size=16)
    assert request.uncached_tokens(0) == 40
    assert request.uncached_tokens(2) == 8
    assert request.uncached_tokens(3) == 0  # a partial last page served whole never goes negative
    with pytest.raises(RouterError):
        RouteRequest((), prompt_tokens=1, max_tokens=1, page_size=0)


@pytest.mark.parametrize("session", [5, b"s", ["x"], 1.5])
def test_a_session_that_is_not_a_string_is_refused(session: object) -> None:
    """Regression: consistent_hash failed on it with an AttributeError and cache_aware with a TypeError."""
    with pytest.raises(RouterError, match="session"):
        RouteRequest((1,), prompt_tokens=4, max_tokens=1, page_size=4, session=session)  # type: ignore[arg-type]


@pytest.mark.parametrize("tokens", [float("inf"), float("nan"), -1, 10**400])
def test_a_token_count_that_is_not_finite_is_refused(tokens: float) -> None:
    """Regression: an infinite prefill was taken; once it finished, inf - inf = NaN clamped to 0 left the replica's
    load at 0 with another request's tokens still in flight."""
    loads = LoadTracker()
    loads.dispatched(0, "other", 5, 3)
    with pytest.raises(RouterError, match="finite"):
        loads.dispatched(0, "hostile", tokens, 0)
    with pytest.raises(RouterError, match="finite"):
        loads.dispatched(0, "hostile", 0, tokens)
    with pytest.raises(RouterError, match="finite"):
        loads.started(0, "other", tokens)
    assert loads.load(0) == ReplicaLoad(5, 3, 1) and loads.in_flight() == 1


def test_page_keys_given_as_an_iterator_are_read_once_for_every_replica() -> None:
    """Regression: the first replica scored consumed an iterator of page keys, so the others matched what it left
    (cache_aware counted 2 of 3 pages on the replica holding all three, and remembered a shorter prefix in flight)."""
    from radixcache.router import EventBatch, RouterIndex, make_router

    index = RouterIndex()
    for r in (0, 1):
        index.add_replica(r)
    index.apply(EventBatch(1, 1, stored=(1, 2, 3)))
    request = RouteRequest(iter([1, 2, 3]), prompt_tokens=12, max_tokens=1, page_size=4)
    assert request.page_keys == (1, 2, 3)
    assert make_router("cache_aware").route(request, [0, 1], index, LoadTracker()) == (1, 3)
