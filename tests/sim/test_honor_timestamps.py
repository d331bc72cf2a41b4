"""`honor_timestamps`: the cache's clock follows the trace's arrival times instead of counting accesses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache import RadixCache
from radixcache.cli.main import main
from radixcache.errors import RadixCacheError
from radixcache.policy.registry import POLICIES
from radixcache.policy.reuse import ReusePolicy
from radixcache.sim.cache_replay import CacheReplay
from radixcache.sim.compare import compare
from radixcache.sim.simulation import simulate
from radixcache.sim.source import open_source
from radixcache.trace.synthetic import agent_loops, multi_turn_chat
from radixcache.trace.workload import SimRequest, Workload, token_workload
from tests.sim.conftest import MOONCAKE_TRACE


def _figures(result: object) -> tuple:
    r = result
    return (r.hit_tokens, r.hit_blocks, r.evicted_blocks, r.prompt_tokens, r.windows)  # type: ignore[attr-defined]


def test_advance_clock_moves_forward_only_and_refuses_a_bad_time() -> None:
    cache = RadixCache(8)
    cache.advance_clock(5_000)
    cache.match_prefix([1, 2])
    assert cache.clock == 5_001
    cache.insert([1, 2], cache.allocate(2))
    cache.advance_clock(10)  # in the past: no change
    match = cache.match_prefix([1, 2])
    assert (match.node.created, match.node.last_access, cache.clock) == (5_002, 5_003, 5_003)
    for bad in (-1, 1.5, True, "7", None):
        with pytest.raises(RadixCacheError, match="advance_clock"):
            cache.advance_clock(bad)  # type: ignore[arg-type]
    assert cache.clock == 5_003
    cache.check_invariants()


@settings(max_examples=40, deadline=None)
@given(
    gaps=st.lists(st.integers(min_value=0, max_value=5_000), min_size=20, max_size=20),
    seed=st.integers(min_value=0, max_value=3),
    capacity=st.sampled_from([30, 80]),
)
def test_fixed_policies_give_the_same_figures_with_the_trace_clock(gaps: list[int], seed: int, capacity: int) -> None:
    """The trace's times only stretch the clock (bursts and long pauses alike): the order of accesses, and so
    every policy's evictions and hits, stay those of the tick clock."""
    base = token_workload(multi_turn_chat(conversations=6, seed=seed), page_size=2)
    t = 0.0
    requests = []
    for index, r in enumerate(base.requests):
        t += gaps[index % len(gaps)] / 7  # fractions of a millisecond too
        requests.append(r._replace(timestamp_ms=t))
    w = Workload(tuple(requests), base.page_size, base.block_tokens, base.kind)
    for policy in POLICIES:
        ticks = simulate(w, capacity, policy, check=True)
        timed = simulate(w, capacity, policy, check=True, honor_timestamps=True)
        assert _figures(timed) == _figures(ticks), policy
        assert (ticks.clock, timed.clock) == ("requests", "timestamps")


@pytest.mark.skipif(not MOONCAKE_TRACE.exists(), reason="needs ../shared/traces")
def test_lru_on_the_shared_mooncake_trace_is_unchanged_and_the_clock_is_its_time() -> None:
    source = open_source(str(MOONCAKE_TRACE))
    ticks = simulate(source, 878, "lru")
    replay = CacheReplay(source, 878, "lru", honor_timestamps=True)
    leads = []
    for index, request in enumerate(source):
        replay.feed(index, request)
        leads.append(replay.cache.clock - int(request.timestamp_ms * 1000))  # ahead of its arrival, in µs
    replay.close()
    timed = replay.result()
    assert _figures(timed) == _figures(ticks) and timed.clock == "timestamps"
    # Past its arrival by the request's own match and its predecessor's insert (two ticks), or a few more where
    # several requests share one millisecond; never by a millisecond.
    assert all(0 < lead < 1000 for lead in leads)
    assert sum(lead <= 2 for lead in leads) >= 0.9 * len(leads)
    assert replay.cache.clock > 1_000_000_000  # the trace spans about 17 minutes, in microseconds


def test_reuse_measures_the_wait_between_two_reads_in_trace_time() -> None:
    """Two requests share a prefix 7 ms apart: the wait `reuse` learns from is 7,000 µs (give or take the two
    ticks of the first request's match and insert), not the one request between them."""
    prompts = [(1, 2, 3, 4), (1, 2, 3, 4, 5)]
    w = Workload(tuple(SimRequest(t, p, (), len(p)) for t, p in zip((3.0, 10.0), prompts, strict=True)), 1, 1, "token")
    waits = {}
    for honor in (False, True):
        policy = ReusePolicy()
        simulate(w, 16, policy, honor_timestamps=honor, check=True)
        waits[honor] = policy._all_waits
    assert waits[False] == 1  # one tick: the first request's insert, then the second's match
    assert 7_000 - 2 <= waits[True] <= 7_000 + 2


def test_compare_takes_the_trace_clock_and_keeps_the_fixed_policies_figures() -> None:
    w = token_workload(agent_loops(agents=4, seed=3), page_size=4)
    plain = {row.name: row.result for row in compare(w, 60, ["lru", "lfu", "reuse"])}
    timed = {row.name: row.result for row in compare(w, 60, ["lru", "lfu", "reuse"], honor_timestamps=True)}
    for name in ("lru", "lfu", "belady", "belady-admission"):
        assert _figures(timed[name]) == _figures(plain[name]), name
    assert timed["reuse"].clock == "timestamps" and plain["reuse"].clock == "requests"


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_the_cli_flag_reports_its_clock_and_refuses_replicas(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    code, out, err = _run("trace", "gen", "chat", str(path), "--count", "12", "--set", "turns=2,4")
    assert code == 0, out + err
    base = ("simulate", str(path), "--capacity-blocks", "100", "--page-size", "4", "--json")
    reports = {}
    for flags in ((), ("--honor-timestamps",)):
        code, out, err = _run(*base, *flags)
        assert code == 0, out + err
        reports[flags] = json.loads(out)
    plain, timed = reports[()], reports[("--honor-timestamps",)]
    assert (plain["clock"], timed["clock"]) == ("requests", "timestamps")
    assert timed["hit_tokens"] == plain["hit_tokens"] and timed["evicted_blocks"] == plain["evicted_blocks"]
    code, out, err = _run(*base, "--policies", "lru,reuse", "--honor-timestamps")
    assert code == 0, out + err
    assert all(run["clock"] == "timestamps" for run in json.loads(out)["runs"] if run["kind"] != "infinite")
    code, _, err = _run(*base, "--replicas", "2", "--honor-timestamps")
    assert code == 2 and "--honor-timestamps" in err


@pytest.mark.parametrize(
    "extra",
    [
        ["--honor-timestamps", "--policy", "reuse"],
        ["--honor-timestamps", "--policy", "tlru", "--in-memory"],
        ["--leases", "--policy", "agent"],
    ],
)
@pytest.mark.parametrize("kind", ["mooncake", "tokens"])
def test_a_timestamp_past_the_clocks_range_is_refused_at_its_line(tmp_path: Path, extra: list[str], kind: str) -> None:
    """A finite timestamp past 1.8e305 ms is infinite in µs: the replay failed with OverflowError ('internal
    error'), then with an error that named no file or line; the trace just below it replays."""
    line = {"input_length": 1000, "output_length": 6, "hash_ids": [0, 1], "retain_for": 5}
    if kind == "tokens":
        line = {"tokens": list(range(40)), "output_length": 6, "retain_for": 5}
        extra = [*extra, "--page-size", "16"]
    for stamp, code in ((1.7e305, 0), (1.7976931348623156e305, 0), (1.7976931348623158e305, 1), (1e306, 1)):
        trace = tmp_path / "t.jsonl"
        trace.write_text(json.dumps({"timestamp": 1.0, **line}) + "\n" + json.dumps({"timestamp": stamp, **line}))
        result = CliRunner().invoke(main, ["simulate", str(trace), "--capacity-blocks", "2", *extra])
        assert result.exit_code == code, (stamp, result.output)
        if code:
            assert f"{trace}:2: field 'timestamp'" in result.stderr and "too large" in result.stderr, result.stderr
