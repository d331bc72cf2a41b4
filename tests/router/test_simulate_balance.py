"""scripts/simulate_balance.py: cache_aware's balance term against rules that keep a longer match on an idle replica.
Its counting router routes exactly as the shipped one, counts a diversion where one happens, and its variants change
what they say they change."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from radixcache.router import EventBatch, LoadTracker, RouteRequest, RouterIndex, make_router
from radixcache.sim.routing_replay import RoutingReplay
from radixcache.sim.routing_workload import arrival_times, routed_requests
from radixcache.trace.synthetic import multi_turn_chat
from radixcache.trace.workload import token_workload
from tests.refusals import assert_refused
from tests.router.test_scripts import load_script, tiny_chat

balance = load_script("simulate_balance.py")


def replay(router: object, rate: float) -> RoutingReplay:
    chat = list(multi_turn_chat(conversations=16, system_prompts=2, system_tokens=64, turns=(2, 4), seed=3))
    run = RoutingReplay(4, 24, router, page_size=16, block_tokens=16, record=True)  # type: ignore[arg-type]
    run.run(arrival_times(routed_requests(token_workload(chat, 16)), rate, "poisson", 0))
    return run


def test_the_counting_router_routes_as_the_shipped_one() -> None:
    counting = balance.CountingRouter("shipped")
    assert replay(counting, 2.0).records == replay(make_router("cache_aware"), 2.0).records
    assert counting.routed == len(replay(make_router("cache_aware"), 2.0).records)


def idle_pair() -> tuple[RouterIndex, LoadTracker, RouteRequest]:
    """Two idle replicas (a prefill token costs 1, a decode token 0): replica 0 holds 4 pages (64 tokens) of a
    72-token prompt, replica 1 none of it."""
    index, loads = RouterIndex(), LoadTracker(1.0, 0.0)
    for r in (0, 1):
        index.add_replica(r)
    assert index.apply(EventBatch(0, 1, tuple(range(4))))
    return index, loads, RouteRequest(list(range(4)), 72, 0, 16)


def test_the_shipped_balance_diverts_from_an_idle_match_and_the_variants_do_not() -> None:
    index, loads, request = idle_pair()
    shipped = balance.CountingRouter("shipped")
    # replica 0 took 40 s of work lately, 1 none: balance 40 - 20 on 0, -20 on 1
    shipped._recent.update({0: 40.0, 1: 0.0})
    assert shipped.route(request, [0, 1], index, loads).replica == 0  # 8 + 2 * 8 + 20 < 72 + 2 * 72 - 20
    assert shipped.diverted == 0
    shipped = balance.CountingRouter("shipped")
    # 24 + 200 > 216 - 200: the balance term outweighs the 64 tokens the match saves
    shipped._recent.update({0: 400.0, 1: 0.0})
    assert shipped.route(request, [0, 1], index, loads).replica == 1 and shipped.diverted == 1
    for variant in ("balance=0", "keep-idle-match"):
        router = balance.CountingRouter(variant)
        router._recent.update({0: 400.0, 1: 0.0})
        assert router.route(request, [0, 1], index, loads).replica == 0 and router.diverted == 0


def test_no_variant_but_the_shipped_balance_diverts_with_sequential_arrivals() -> None:
    for variant in ("balance=0", "keep-idle-match"):
        router = balance.CountingRouter(variant)
        replay(router, 0.001)
        assert router.routed > 0 and router.diverted == 0


def test_the_script_prints_a_row_per_variant_and_names_a_missing_trace(tmp_path: Path) -> None:
    trace = tiny_chat(tmp_path, name="chat")
    result = CliRunner().invoke(balance.main, [str(trace), "--replicas", "2", "--load", "1,2"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith("| chat |")]
    assert len(rows) == 3 * len(balance.VARIANTS)  # x1, x2 and sequential
    assert_refused(CliRunner().invoke(balance.main, [str(tmp_path / "none.jsonl")]), "No such file")
