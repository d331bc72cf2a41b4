"""Hit counts on small hand-built traces, checked against values worked out by hand."""

from __future__ import annotations

import pytest

from radixcache.errors import RadixCacheError
from radixcache.sim.evaluation import evaluate
from radixcache.sim.simulation import simulate
from radixcache.trace import HashRequest
from radixcache.trace.records import TokenRequest
from radixcache.trace.workload import hash_workload, token_workload


def req(t: float, tokens: list[int], output: list[int] | None = None) -> TokenRequest:
    out = tuple(output) if output is not None else None
    return TokenRequest(t, tuple(tokens), len(output or ()), output_tokens=out)


def test_unbounded_cache_hits_every_prefix_seen_before() -> None:
    # A: nothing cached. B shares [1, 2, 3] with A. C shares [1, 2].
    w = token_workload([req(0, [1, 2, 3, 4]), req(1, [1, 2, 3, 5, 6]), req(2, [1, 2, 7])])
    r = simulate(w, 100, check=True)
    assert (r.requests, r.prompt_tokens, r.hit_tokens, r.evicted_blocks) == (3, 12, 5, 0)
    assert r.hit_rate == pytest.approx(5 / 12)
    assert (r.prompt_blocks, r.hit_blocks) == (12, 5)


def test_lru_at_capacity_evicts_the_oldest_tail_first() -> None:
    # cap 5. A=[1,2,3,4] takes 4. B=[5,6,7] needs 3, 1 free: LRU trims A's deepest 2 -> A keeps [1,2].
    # C=[1,2,3] hits 2, needs 1: cache is full ([1,2] + [5,6,7]); [1,2] is locked, so B's tail 7 goes.
    # D=[5,6,7] hits [5,6] = 2.
    w = token_workload([req(0, [1, 2, 3, 4]), req(1, [5, 6, 7]), req(2, [1, 2, 3]), req(3, [5, 6, 7])])
    r = simulate(w, 5, "lru", check=True)
    assert (r.hit_tokens, r.evicted_blocks) == (4, 3 + 1)  # D also evicts one block to re-add 7


def test_recorded_output_is_cached_but_the_partial_tail_page_is_not() -> None:
    # page 2. A prompt [1,2,3] + output [4,5] -> pages [1,2] [3,4] cached, tail [5] freed.
    # B prompt [1,2,3,4,9] hits 4 tokens = 2 pages; prompt blocks are ceil(3/2) + ceil(5/2) = 5.
    w = token_workload([req(0, [1, 2, 3], [4, 5]), req(1, [1, 2, 3, 4, 9])], page_size=2)
    r = simulate(w, 10, check=True)
    assert (r.prompt_tokens, r.hit_tokens, r.prompt_blocks, r.hit_blocks) == (8, 4, 5, 2)


def test_hash_trace_counts_the_partial_last_block_exactly() -> None:
    # block size 4. A: 10 tokens = 4+4+2. B shares 2 full blocks: 8. C repeats A: 10 (the last block counts 2).
    # D holds 2 blocks of 7 tokens (4+3) that A cached: 7.
    trace = [
        HashRequest(0, 10, 1, (1, 2, 3)),
        HashRequest(1, 9, 1, (1, 2, 7)),
        HashRequest(2, 10, 1, (1, 2, 3)),
        HashRequest(3, 7, 1, (1, 2)),
    ]
    r = simulate(hash_workload(trace, block_size=4), 100, check=True)
    assert (r.prompt_tokens, r.hit_tokens) == (36, 0 + 8 + 10 + 7)
    assert (r.prompt_blocks, r.hit_blocks) == (11, 0 + 2 + 3 + 2)


def test_hash_trace_rejects_hash_ids_that_do_not_fit_input_length() -> None:
    with pytest.raises(RadixCacheError, match="request 0: 2 hash ids, but input_length 10"):
        hash_workload([HashRequest(0, 10, 1, (1, 2))], block_size=4)


@pytest.mark.parametrize("timestamp", [float("nan"), float("inf"), -float("inf"), "5", None])
def test_a_workload_built_in_python_refuses_a_timestamp_that_is_not_a_finite_number(timestamp: object) -> None:
    """Regression: records built in Python are not checked as a trace's readers check them, and a NaN or infinite
    timestamp failed the replay's time windows with a ValueError or an OverflowError (NaN also sorted nowhere)."""
    with pytest.raises(RadixCacheError, match=f"request 1: timestamp_ms must be a finite number, got {timestamp!r}"):
        token_workload([req(0, [1, 2]), req(timestamp, [1, 2, 3])])  # type: ignore[arg-type]
    with pytest.raises(RadixCacheError, match=f"request 1: timestamp_ms must be a finite number, got {timestamp!r}"):
        hash_workload([HashRequest(0, 4, 1, (1,)), HashRequest(timestamp, 8, 1, (1, 2))], block_size=4)  # type: ignore[arg-type]
    early = token_workload([req(5, [1, 2]), req(-1e300, [1, 2, 3])])  # finite, in any order: sorted
    assert [r.timestamp_ms for r in early.requests] == [-1e300, 5]
    assert simulate(early, 10, windows=3).hit_tokens == 2


def test_in_flight_requests_do_not_see_each_others_blocks_until_they_finish() -> None:
    trace = [req(0, [1, 2, 3]), req(0, [1, 2, 3]), req(1, [1, 2, 3])]
    assert simulate(token_workload(trace), 100, concurrency=1).hit_tokens == 6
    # With 2 in flight, B is admitted while A runs and misses; C is admitted after A finishes and hits.
    assert simulate(token_workload(trace), 100, concurrency=2, check=True).hit_tokens == 3


def test_in_flight_blocks_stay_locked_and_a_request_too_large_caches_what_fits() -> None:
    # cap 6, two in flight: A holds 4 blocks, so B (3 blocks) finds only 2 it can use.
    trace = [req(0, [1, 2, 3, 4]), req(1, [5, 6, 7]), req(2, [5, 6, 7])]
    r = simulate(token_workload(trace), 6, concurrency=2, check=True)
    assert r.oversized_requests == 1
    assert r.hit_tokens == 0  # C is admitted when A finishes, B is still in flight
    r1 = simulate(token_workload(trace), 6, concurrency=1, check=True)
    assert (r1.oversized_requests, r1.hit_tokens) == (0, 3)


def test_hit_rate_per_window_splits_the_trace_by_arrival_time() -> None:
    trace = [req(0, [1, 2]), req(10, [1, 2]), req(20, [1, 2, 3, 4])]
    r = simulate(token_workload(trace), 100, windows=2)
    assert [(w.requests, w.prompt_tokens, w.hit_tokens) for w in r.windows] == [(1, 2, 0), (2, 6, 4)]
    assert r.windows[1].hit_rate == pytest.approx(4 / 6)


def test_requests_replay_in_arrival_order_not_file_order() -> None:
    trace = [req(5, [1, 2, 3]), req(1, [1, 2])]
    assert simulate(token_workload(trace), 100).hit_tokens == 2


def test_namespaces_never_share() -> None:
    a = TokenRequest(0, (1, 2, 3), 0, namespace="a")
    b = TokenRequest(1, (1, 2, 3), 0, namespace="b")
    assert simulate(token_workload([a, b]), 100).hit_tokens == 0


def test_report_holds_the_infinite_and_belady_bounds() -> None:
    trace = [req(i, [i % 3, 7, 8, 9]) for i in range(12)]
    report = evaluate(token_workload(trace), 6, "lru", belady=True)
    assert report.result.hit_rate <= report.belady.hit_rate <= report.infinite.hit_rate
    keys = report.as_dict()
    assert {"hit_rate", "hit_tokens", "prompt_tokens", "requests", "evicted_blocks"} <= keys.keys()
    assert {"infinite_hit_rate", "belady_hit_rate"} <= keys.keys()


def test_bad_arguments_raise() -> None:
    w = token_workload([req(0, [1])])
    with pytest.raises(RadixCacheError):
        simulate(w, 0)
    with pytest.raises(RadixCacheError):
        simulate(w, 4, concurrency=0)
    with pytest.raises(RadixCacheError):
        simulate(w, 4, "nope")


@pytest.mark.parametrize("windows", [100_001, 10**12])
def test_more_windows_than_the_cli_allows_is_refused_by_the_library_too(windows: int) -> None:
    """Regression: the CLI stopped --windows at 100,000, but simulate(), evaluate() and simulate_infinite() made
    every window's counters up front for any count: windows=10**9 ran the machine out of memory (the process was
    killed) before the first request."""
    from radixcache.sim.simulation import simulate_infinite

    workload = token_workload([req(0, [1, 2]), req(1, [1, 2, 3])])
    for run in (
        lambda: simulate(workload, 4, windows=windows),
        lambda: evaluate(workload, 4, windows=windows),
        lambda: simulate_infinite(workload, windows=windows),
    ):
        with pytest.raises(RadixCacheError, match=r"windows must be an int in \[1, 100,000\]"):
            run()
    widest = simulate(workload, 4, windows=100_000)
    assert len(widest.windows) == 100_000 and sum(w.requests for w in widest.windows) == 2


@pytest.mark.parametrize("value", ["false", 0, 1, None])
def test_a_flag_that_is_no_bool_is_refused_by_name(value: object) -> None:
    """Regression: simulate(check="false") ran the invariant check after every request, evaluate(belady="no") ran
    Belady's replay, honor_timestamps="false" moved the clock to the trace's times: a string read from a config is
    truthy. Each flag is a bool, as ReplayConfig's and EngineConfig's are."""
    from radixcache.sim.routing_replay import simulate_routing

    workload = token_workload([req(0, [1, 2]), req(1, [1, 2, 3])])
    runs = {
        "check": lambda kw: simulate(workload, 4, **kw),
        "honor_timestamps": lambda kw: evaluate(workload, 4, **kw),
        "flat": lambda kw: simulate(workload, 4, **kw),
        "belady": lambda kw: evaluate(workload, 4, **kw),
        "infinite": lambda kw: evaluate(workload, 4, **kw),
        "belady_admission": lambda kw: evaluate(workload, 4, **kw),
        "parallel": lambda kw: evaluate(workload, 4, **kw),
    }
    for name, run in runs.items():
        with pytest.raises(RadixCacheError, match=f"{name} must be True or False, got {value!r}"):
            run({name: value})
        assert run({name: False}) is not None
    with pytest.raises(RadixCacheError, match=f"check must be True or False, got {value!r}"):
        simulate_routing(workload, 2, 4, check=value)  # type: ignore[arg-type]
    assert simulate_routing(workload, 2, 4, check=False).requests == 2


def test_a_progress_that_is_no_function_and_tiers_that_are_no_tier_config_are_refused_first() -> None:
    """progress=3 was a TypeError at its first call, 256 requests into the replay; tiers=3 an AttributeError
    ('host_capacity_blocks') naming no argument."""
    from radixcache.sim.routing_replay import simulate_routing
    from radixcache.sim.simulation import simulate_infinite

    workload = token_workload([req(0, [1, 2]), req(1, [1, 2, 3])])
    for run in (
        lambda: simulate(workload, 4, progress=3),  # type: ignore[arg-type]
        lambda: evaluate(workload, 4, progress="log"),  # type: ignore[arg-type]
        lambda: simulate_infinite(workload, progress=3),  # type: ignore[arg-type]
        lambda: simulate_routing(workload, 2, 4, progress=3),  # type: ignore[arg-type]
    ):
        with pytest.raises(RadixCacheError, match="progress must be a function"):
            run()
    for run in (lambda: simulate(workload, 4, tiers=3), lambda: evaluate(workload, 4, tiers={"host": 8})):
        with pytest.raises(RadixCacheError, match="tiers must be a TierConfig or None"):
            run()  # type: ignore[arg-type]
    seen: list[int] = []
    assert simulate(workload, 4, progress=seen.append).requests == 2 and sum(seen) == 2


def test_a_list_of_requests_for_a_workload_is_refused_with_what_to_pass() -> None:
    """simulate([TokenRequest, ...]) (what the runtime's replay takes) was an AttributeError ('page_size')."""
    from radixcache.sim.routing_replay import simulate_routing
    from radixcache.sim.simulation import simulate_infinite

    requests = [req(0, [1, 2]), req(1, [1, 2, 3])]
    for run in (
        lambda: simulate(requests, 4),  # type: ignore[arg-type]
        lambda: evaluate(requests, 4),  # type: ignore[arg-type]
        lambda: simulate_infinite(requests),  # type: ignore[arg-type]
        lambda: simulate_routing(requests, 2, 4),  # type: ignore[arg-type]
    ):
        with pytest.raises(RadixCacheError, match=r"workload must be a Workload .*token_workload.*, got list"):
            run()
    assert simulate(token_workload(requests), 4).requests == 2


def test_a_workload_of_the_wrong_kind_of_request_is_refused_naming_the_other_builder() -> None:
    """token_workload([HashRequest]) was an AttributeError ('tokens'), hash_workload([TokenRequest]) one naming
    'block_size', and None a TypeError."""
    hashed = HashRequest(0.0, 4, 1, (7,), block_size=4)
    with pytest.raises(RadixCacheError, match=r"request 0 must be a TokenRequest, got HashRequest \(use hash_workload"):
        token_workload([hashed])
    with pytest.raises(RadixCacheError, match=r"request 1 must be a HashRequest, got TokenRequest \(use token_w"):
        hash_workload([hashed, req(1, [1, 2])])
    for build in (token_workload, hash_workload):
        with pytest.raises(RadixCacheError, match="requests must be an iterable of"):
            build(None)  # type: ignore[arg-type]
    assert simulate(hash_workload(iter([hashed])), 4).requests == 1  # any iterable of the right kind
