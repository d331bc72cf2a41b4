"""The routing simulator: a hand-worked two-replica replay, the index kept equal to every replica's tree by its
events, the cache-aware router against round robin on a small chat trace, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.errors import RadixCacheError
from radixcache.policy.classic import CostAwarePolicy
from radixcache.policy.reuse import ReusePolicy
from radixcache.router import make_router
from radixcache.sim.routing_replay import RoutingReplay, simulate_routing
from radixcache.sim.routing_results import RoutingCosts
from radixcache.sim.routing_workload import arrival_times, routed_in_memory, routed_requests
from radixcache.sim.source import open_source
from radixcache.trace import HashRequest, write_mooncake
from radixcache.trace.synthetic import multi_turn_chat
from radixcache.trace.workload import SimRequest, Workload, token_workload
from tests.refusals import assert_refused

MOONCAKE_TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"


def hand_workload() -> Workload:
    """Four requests at page size 2 (in tokens): A and B at once, C at 10 s (A's prompt, its output and more), D at
    10.5 s while C runs (A's first two pages and one new)."""
    requests = (
        SimRequest(0.0, (1, 2, 3, 4), (5, 6), 4),
        SimRequest(0.0, (7, 8, 9, 10), (), 4),
        SimRequest(10_000.0, (1, 2, 3, 4, 5, 6, 11, 12), (), 8),
        SimRequest(10_500.0, (1, 2, 3, 4, 13, 14), (), 6),
    )
    return Workload(requests, 2, 2, "token")


def hand_replay(router: object) -> RoutingReplay:
    # one second per prompt token, half a second per output token: every figure below is worked by hand
    replay = RoutingReplay(
        2, 100, router, page_size=2, block_tokens=2, costs=RoutingCosts(1000.0, 500.0), record=True, check=True
    )
    replay.run(arrival_times(routed_requests(hand_workload())))
    return replay


def test_a_hand_worked_two_replica_replay_with_the_cache_aware_router() -> None:
    replay = hand_replay(make_router("cache_aware", miss_weight=1.0, balance=0.0))
    # A -> 0 (idle tie: the lower id), prefill 4 s, decode 1 s, done at 5 s. B -> 1 (0 has 5 s of work queued).
    # C at 10 s -> 0, which holds A's prompt and output (3 pages): 2 tokens to prefill. D at 10.5 s -> 0: it holds 2
    # of D's pages, so 2 s of C's prefill + 2 s of D's beat 6 s on idle 1; D waits until 12 s, then 2 s of prefill.
    assert replay.records == [(0, 0, 0, 4.0), (1, 1, 0, 4.0), (2, 0, 6, 2.0), (3, 0, 4, 3.5)]
    r = replay.result()
    assert (r.prompt_tokens, r.hit_tokens) == (22, 10)
    assert [(x.requests, x.hit_tokens, x.busy_s) for x in r.replicas] == [(3, 10, 9.0), (1, 0, 4.0)]
    assert r.imbalance == pytest.approx(9.0 / 6.5)
    assert r.ttft.p50_s == 3.5 and r.ttft.max_s == 4.0
    assert r.events.simulated_s == 14.0  # from the first arrival to D's finish


def test_the_same_replay_through_round_robin() -> None:
    replay = hand_replay(make_router("round_robin"))
    # D goes to replica 1, which holds only B's pages: all 6 tokens to prefill, at once
    assert replay.records == [(0, 0, 0, 4.0), (1, 1, 0, 4.0), (2, 0, 6, 2.0), (3, 1, 0, 6.0)]
    assert replay.result().hit_tokens == 6


def test_a_replica_at_half_speed_takes_twice_as_long() -> None:
    """`speeds` divides a replica's service times; the router is not told (round robin routes as before)."""
    replay = RoutingReplay(
        2, 100, "round_robin", page_size=2, block_tokens=2, costs=RoutingCosts(1000.0, 500.0), record=True,
        check=True, speeds=(0.5, 1.0),
    )  # fmt: skip
    replay.run(arrival_times(routed_requests(hand_workload())))
    # A on 0: 4 prompt tokens at 2 s each (8 s), 2 output tokens at 1 s each, done at 10 s, as C arrives there: its
    # 2 uncached tokens take 4 s. B and D on 1 at full speed, as in test_the_same_replay_through_round_robin.
    assert replay.records == [(0, 0, 0, 8.0), (1, 1, 0, 4.0), (2, 0, 6, 4.0), (3, 1, 0, 6.0)]
    assert replay.result().replicas[0].busy_s == 10.0 + 2 * 2.0  # A, then C: 2 prompt tokens, no output


@pytest.mark.parametrize("speeds", [(1.0,), (1.0, 0.0), (1.0, float("nan")), (1.0, float("inf")), (1.0, True), 2.0])
def test_speeds_that_are_not_one_positive_number_per_replica_are_refused(speeds: object) -> None:
    with pytest.raises(RadixCacheError, match="speeds"):
        RoutingReplay(2, 100, "round_robin", speeds=speeds)  # type: ignore[arg-type]


def test_events_keep_the_index_equal_to_every_replicas_tree() -> None:
    """`check=True` recomputes each replica's page keys from its tree after every event and compares them with
    the index; a tiny capacity makes every request evict (whole leaves and trimmed tails)."""
    chat = list(
        multi_turn_chat(
            conversations=12,
            system_prompts=2,
            system_tokens=40,
            turns=(2, 4),
            user_tokens=12,
            assistant_tokens=10,
            mean_interarrival_ms=50,
            mean_think_ms=300,
            vocab=50,
            seed=3,
        )
    )
    namespaced = [
        SimRequest(
            r.timestamp_ms,
            tuple(r.tokens),
            tuple(r.output_tokens or ()),
            len(r.tokens),
            1,
            f"tenant-{i % 2}",
            r.session,
        )
        for i, r in enumerate(chat)
    ]
    workloads = [token_workload(chat, 4), Workload(tuple(namespaced), 4, 4, "token")]
    for router in ("cache_aware", "sglang", "round_robin"):
        for workload in workloads:
            result = simulate_routing(workload, 3, 24, router, rate=20.0, check=True)
            assert result.requests == len(chat)
            assert sum(r.evicted_blocks for r in result.replicas) > 0


def test_events_keep_the_index_equal_on_a_hash_trace(tmp_path: Path) -> None:
    path = tmp_path / "hash.jsonl"
    records = []
    for i in range(60):  # conversations of growing chained ids, some sharing a first block
        conv, turn = i % 7, i // 7
        ids = [1000 * conv + k for k in range(2 + turn)]
        records.append(HashRequest(float(i * 100), 512 * len(ids) - 100, 10 + i, tuple(ids)))
    write_mooncake(path, records)
    source = open_source(path)
    result = simulate_routing(source, 4, 6, "cache_aware", rate=5.0, check=True)
    assert result.requests == 60 and result.hit_tokens > 0
    assert sum(r.evicted_blocks for r in result.replicas) > 0
    # output lengths come from the file: decode time is in the busy time
    outs = [out for _, out in routed_requests(source)]
    assert outs == [10 + i for i in range(60)]
    in_memory = routed_in_memory(source)
    assert [out for _, out in in_memory] == outs
    again = simulate_routing(in_memory, 4, 6, "cache_aware", rate=5.0)
    assert again.as_dict()["hit_tokens"] == result.hit_tokens


def test_the_replay_keeps_nothing_per_request() -> None:
    workload = token_workload(list(multi_turn_chat(conversations=30, vocab=100)), 16)
    replay = RoutingReplay(4, 200, "cache_aware", page_size=16, block_tokens=16)
    replay.run(arrival_times(routed_requests(workload), rate=3.0))
    assert replay.records == [] and not replay._heap and replay.loads.in_flight() == 0
    assert all(not r.queue and not r.busy for r in replay.replicas)


def test_arrivals_at_a_rate_are_seeded_or_even() -> None:
    pairs = [(SimRequest(0.0, (1,), (), 1), 0)] * 5
    poisson = [t for t, _, _ in arrival_times(pairs, rate=2.0, seed=1)]
    assert poisson == [t for t, _, _ in arrival_times(pairs, rate=2.0, seed=1)]
    assert poisson != [t for t, _, _ in arrival_times(pairs, rate=2.0, seed=2)]
    assert [t for t, _, _ in arrival_times(pairs, rate=2.0, arrivals="even")] == [0.0, 0.5, 1.0, 1.5, 2.0]


@pytest.mark.parametrize("arrivals", ["poisson", "even"])
def test_a_rate_whose_mean_gap_overflows_is_refused(arrivals: str) -> None:
    """Regression: a subnormal rate passed the check (finite, > 0), but 1/rate is inf: every arrival after the first
    was at inf, and the report's TTFT percentiles were NaN."""
    from radixcache.errors import RadixCacheError

    pairs = [(SimRequest(0.0, (1,), (), 1), 0)] * 3
    with pytest.raises(RadixCacheError, match="too small: its mean gap 1/rate is not a finite time"):
        next(arrival_times(pairs, rate=1e-320, arrivals=arrivals))
    assert [t for t, _, _ in arrival_times(pairs, rate=1e-300, arrivals="even")] == pytest.approx([0, 1e300, 2e300])


@pytest.mark.parametrize(("arrivals", "late"), [("poisson", 0), ("even", 1)])
def test_a_rate_whose_arrivals_sum_past_the_doubles_is_refused_by_the_cli(
    tmp_path: Path, arrivals: str, late: int
) -> None:
    """Regression: --rate 1e-307 has a finite mean gap (1e307 s), so it passed the check, but the arrivals summed past
    the largest double: every later arrival was at inf, its TTFT inf - inf, and the table printed TTFT p50, p99 and
    mean as nan (the JSON as null) with exit 0. The replay stops at the first arrival past a trace's latest
    timestamp, naming the request and the rate."""
    trace = tmp_path / "t.jsonl"
    write_mooncake(trace, [HashRequest(i, 100, 2, (i,)) for i in range(30)])
    args = ["simulate", str(trace), "--capacity-blocks", "4", "--replicas", "2", "--rate", "1e-307"]
    result = CliRunner().invoke(main, [*args, "--arrivals", arrivals])
    out = assert_refused(result, "rate 1e-307 requests/s is too small for this trace", f"request {late} would arrive")
    assert "nan" not in out
    fine = CliRunner().invoke(main, [*args[:-1], "1e-300", "--arrivals", arrivals, "--json"])
    assert fine.exit_code == 0, fine.output
    report = json.loads(fine.stdout)
    assert all(report[k] is not None and report[k] >= 0 for k in ("ttft_p50_s", "ttft_p99_s", "ttft_mean_s"))


def test_a_replicas_memory_grows_with_its_cached_pages_not_its_capacity() -> None:
    """Regression: each replica kept a list of `capacity` page keys, one per block id: --capacity-blocks 1e9 with
    --replicas was an internal MemoryError (8 GB a replica) where the plain replay of the same cache takes 40 MB."""
    import tracemalloc

    workload = token_workload(list(multi_turn_chat(conversations=5, vocab=100)), 16)
    small = simulate_routing(workload, 2, 10_000, "cache_aware", rate=3.0)
    tracemalloc.start()
    try:
        huge = simulate_routing(workload, 2, 20_000_000, "cache_aware", rate=3.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    assert small.replicas[0].evicted_blocks == small.replicas[1].evicted_blocks == 0  # neither cache fills
    assert (huge.hit_tokens, huge.prompt_tokens) == (small.hit_tokens, small.prompt_tokens)


def test_a_recorded_hash_trace_publishes_its_output_pages(tmp_path: Path) -> None:
    """Regression: a recorded hash trace (output_hash_ids, as --record-trace writes them) died with "zip() argument
    2 is longer than argument 1": a finished request's output pages were published with its prompt's keys only.
    Now every page the tree adopts is published under its own id, and the index equals each replica's tree."""
    path = tmp_path / "recorded.jsonl"
    records = [
        HashRequest(float(i * 10), 60, 20, (1, 2, 3, 100 + i), block_size=16, output_hash_ids=(500 + i, 600 + i))
        for i in range(20)
    ]
    write_mooncake(path, records)
    result = simulate_routing(open_source(path), 2, 12, "cache_aware", check=True)  # evicting: 12 pages a replica
    assert result.requests == 20 and sum(r.evicted_blocks for r in result.replicas) > 0
    replay = RoutingReplay(2, 1000, "round_robin", block_tokens=16, kind="hash", check=True)  # nothing evicted
    replay.run(arrival_times(routed_requests(open_source(path))))
    for r in (0, 1):  # round robin: replica r served requests r, r + 2, ...; each inserted 3 whole pages and 2 more
        outputs = {k for i in range(r, 20, 2) for k in (500 + i, 600 + i)}
        assert replay.index.keys(r) == {1, 2, 3} | outputs


@pytest.mark.parametrize("replicas", [4097, 10**12])
def test_more_replicas_than_the_cli_allows_is_refused_by_the_library_too(replicas: int) -> None:
    """Regression: the CLI stopped --replicas at 4,096, but RoutingReplay made every replica's tree and queue up front
    for any count: simulate_routing(..., 10**9, ...) ran the machine out of memory before the first request."""
    from radixcache.errors import RadixCacheError

    workload = token_workload(list(multi_turn_chat(conversations=2, vocab=50)), 16)
    with pytest.raises(RadixCacheError, match=r"replicas must be an int in \[1, 4,096\]"):
        simulate_routing(workload, replicas, 8)
    assert simulate_routing(workload, 4096, 8, "round_robin").num_replicas == 4096


def test_cache_aware_beats_round_robin_on_a_small_chat_trace() -> None:
    # No wall-clock bound: it flaked on a busy machine, and the run's 300 s timeout still ends a hang.
    workload = token_workload(list(multi_turn_chat(conversations=80, seed=1)), 16)
    results = {
        r: simulate_routing(workload, 8, 512, r, rate=2.5) for r in ("round_robin", "least_loaded", "cache_aware")
    }
    rr, ll, ours = results["round_robin"], results["least_loaded"], results["cache_aware"]
    assert ours.hit_rate >= 1.5 * rr.hit_rate
    assert ours.imbalance <= 1.3
    assert ours.ttft.p99_s <= ll.ttft.p99_s


@pytest.mark.skipif(not MOONCAKE_TRACE.is_file(), reason="the shared Mooncake trace is not beside this clone")
def test_the_acceptance_on_the_mooncake_trace() -> None:
    """docs/routing.md's setting: 16 replicas of 1,000 blocks, 0.3 requests/s."""
    source = open_source(MOONCAKE_TRACE)
    results = {
        r: simulate_routing(source, 16, 1000, r, rate=0.3)
        for r in ("round_robin", "least_loaded", "sglang", "cache_aware")
    }
    ours = results["cache_aware"]
    assert ours.hit_rate >= 1.5 * results["round_robin"].hit_rate
    assert ours.hit_rate >= results["sglang"].hit_rate
    assert ours.imbalance <= 1.3
    assert ours.ttft.p99_s <= results["least_loaded"].ttft.p99_s


# ---------------------------------------------------------------------------------------------- the CLI


@pytest.fixture
def chat(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    result = CliRunner().invoke(main, ["trace", "gen", "chat", str(path), "--count", "20", "--set", "turns=2,4"])
    assert result.exit_code == 0, result.output
    return path


def test_simulate_replicas_json_has_the_documented_keys(chat: Path) -> None:
    args = ["simulate", str(chat), "--capacity-blocks", "200", "--page-size", "16", "--replicas", "4"]
    result = CliRunner().invoke(main, [*args, "--router", "sglang", "--rate", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for key in ("hit_rate", "imbalance", "ttft_p50_s", "ttft_p99_s", "replicas", "router", "num_replicas"):
        assert key in report
    assert report["router"] == "sglang" and report["num_replicas"] == 4 and len(report["replicas"]) == 4
    assert {"requests", "prompt_tokens", "hit_rate", "busy_s"} <= set(report["replicas"][0])
    assert sum(r["requests"] for r in report["replicas"]) == report["requests"]


def test_simulate_replicas_prints_a_table(chat: Path) -> None:
    args = ["simulate", str(chat), "--capacity-blocks", "200", "--page-size", "16", "--replicas", "3", "--rate", "2"]
    result = CliRunner().invoke(main, [*args, "--decode-ms-per-token", "1", "--arrivals", "even"])
    assert result.exit_code == 0, result.output
    assert "cache_aware" in result.stdout and "per replica" in result.stdout and "events/s" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "2", "--belady"], "--belady: not with --replicas"),
        (["--replicas", "2", "--host-capacity-blocks", "10"], "not with --replicas"),
        (["--replicas", "2", "--concurrency", "4"], "--concurrency: not with --replicas"),
        (["--router", "sglang"], "--router: only for a routed replay"),
        (["--rate", "3"], "--rate: only for a routed replay"),
        (["--replicas", "2", "--arrivals", "even"], "--arrivals: only with --rate"),
        (["--replicas", "2", "--router", "nope"], "'nope' is not one of"),
        (["--replicas", "0"], "--replicas"),
        (["--replicas", "2", "--rate", "1e-320"], "--rate 1e-320 is too small"),
    ],
)
def test_simulate_replicas_refuses_bad_flags(chat: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["simulate", str(chat), "--capacity-blocks", "200", *args])
    assert_refused(result, message)
    assert message in result.stderr


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"router": 3}, "router must be a name in ROUTERS or a Router, got int"),  # AttributeError ('route')
        ({"router_params": 3}, "router_params must be a mapping"),  # a TypeError from ** unpacking
        ({"seed": True, "rate": 5.0}, "seed must be an int, got True"),  # seeded the arrivals as 1, silently
        ({"seed": "7", "router": "power_of_two"}, "seed must be an int, got '7'"),
    ],
)
def test_simulate_routing_refuses_arguments_of_the_wrong_type_by_name(kwargs: dict, named: str) -> None:
    from radixcache.errors import RadixCacheError

    workload = token_workload(list(multi_turn_chat(conversations=2, turns=(1, 1))))
    with pytest.raises(RadixCacheError, match=named):
        simulate_routing(workload, 2, 64, **kwargs)
    assert simulate_routing(workload, 2, 64, rate=5.0, seed=7).requests == 2


@pytest.mark.parametrize("policy", [CostAwarePolicy, ReusePolicy])
def test_a_policy_object_serves_each_replica_as_its_name_does(policy: type) -> None:
    """Regression: one policy object was shared by every replica's tree, so a replica's evictions raised the others'
    GreedyDual inflation, and reuse learned one set of classes from all of them (keyed by clocks each tree counts
    alone): the figures differed from the same policy given by name. Each replica gets its own copy."""
    workload = token_workload(list(multi_turn_chat(seed=3))[:1000], 16)
    given = policy()
    by_object = simulate_routing(workload, 4, 100, "round_robin", policy=given)
    by_name = simulate_routing(workload, 4, 100, "round_robin", policy=policy.name)
    assert by_object.hit_tokens == by_name.hit_tokens
    assert [r.hit_tokens for r in by_object.replicas] == [r.hit_tokens for r in by_name.replicas]
    assert vars(given) == vars(policy())  # the object given is left as it was


def test_a_session_id_two_tenants_use_is_two_sessions() -> None:
    """Regression: the replay routed by the trace's session id alone, so eight tenants' "chat" were one session,
    stuck to one replica (8, 0, 0, 0), where the cluster scopes a session by its namespace. Now as if each tenant's
    session had a name of its own."""
    prompts = [tuple(range(100 * i, 100 * i + 8)) for i in range(8)]  # no page in common
    requests = [SimRequest(1000.0 * i, p, (), 8, 1, f"t{i}", "chat") for i, p in enumerate(prompts)]
    renamed = [SimRequest(1000.0 * i, p, (), 8, 1, f"t{i}", f"t{i}-chat") for i, p in enumerate(prompts)]

    def placed(reqs: list[SimRequest], router: str) -> list[int]:
        return [r.requests for r in simulate_routing(Workload(tuple(reqs), 4, 4, "token"), 4, 64, router).replicas]

    assert placed(requests, "cache_aware") == placed(renamed, "cache_aware")
    assert sum(n > 0 for n in placed(requests, "consistent_hash")) > 1
