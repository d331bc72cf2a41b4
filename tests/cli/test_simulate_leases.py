"""`radixcache simulate --leases`: the lease hints a trace carries (a recorded Mooncake trace's `retain_for`, an agent
token trace's) replayed by radixcache.sim.lease_replay; the readers keep the hint and refuse a bad one at file:line;
without leases the replay is the plain one on the trace clock (its figures equal `--honor-timestamps`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.sim.source import open_source
from radixcache.trace.agent_sessions import agent_sessions
from radixcache.trace.errors import TraceError
from radixcache.trace.mooncake import HashRequest, iter_mooncake, write_mooncake
from radixcache.trace.token_trace import write_token_jsonl
from radixcache.trace.workload import load_workload


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    path = tmp_path / "agents.jsonl"
    write_token_jsonl(path, agent_sessions(seed=1))
    return path


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["simulate", *args])
    return result.exit_code, result.output


def test_mooncake_lines_keep_the_hint_and_write_it_back(tmp_path: Path) -> None:
    path = tmp_path / "recorded.jsonl"
    requests = [HashRequest(0.0, 1000, 4, (1, 2), retain_for=12.5), HashRequest(5.0, 1000, 4, (1, 3))]
    write_mooncake(path, requests)
    assert [r.retain_for for r in iter_mooncake(path)] == [12.5, None]
    assert [r.retain_for for r in load_workload(str(path)).requests] == [12.5, None]
    streamed = [r.retain_for for r in open_source(str(path))]
    assert streamed == [12.5, None]


@pytest.mark.parametrize(
    "bad", ["-1", "1e10", '"30"', "true", "[30]"], ids=["negative", "huge", "text", "bool", "list"]
)
def test_a_bad_hint_is_a_trace_error_at_its_line(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "bad.jsonl"
    good = '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}'
    path.write_text(good + "\n" + good[:-1] + f', "retain_for": {bad}}}\n')
    with pytest.raises(TraceError) as info:
        list(iter_mooncake(path))
    assert ":2" in str(info.value) and "retain_for" in str(info.value)
    code, out = _run(str(path), "--capacity-blocks", "8", "--leases")
    assert code != 0 and ":2" in out and "retain_for" in out


def test_streamed_token_traces_keep_the_hint(agents: Path) -> None:
    expected = [r.retain_for for r in load_workload(str(agents), page_size=16).requests]
    streamed = [r.retain_for for r in open_source(str(agents), page_size=16)]
    assert streamed == expected and any(h is not None for h in expected) and None in expected


def test_leases_are_granted_and_without_them_the_replay_is_the_plain_one(agents: Path) -> None:
    code, out = _run(str(agents), "--capacity-tokens", "6000", "--page-size", "16", "--leases", "--policies",
                     "lru,agent", "--json")  # fmt: skip
    assert code == 0, out
    summary = json.loads(out)
    hinted = summary["hinted_requests"]
    assert 0 < hinted < summary["requests"]
    runs = {(r["policy"], r["leases"]): r for r in summary["runs"]}
    for policy in ("lru", "agent"):
        assert runs[policy, False]["granted"] == 0
        assert 0 < runs[policy, True]["granted"] <= hinted
    code, plain = _run(str(agents), "--capacity-tokens", "6000", "--page-size", "16", "--in-memory",
                       "--honor-timestamps", "--no-infinite", "--json")  # fmt: skip
    assert code == 0, plain
    assert runs["lru", False]["hit_rate"] == pytest.approx(json.loads(plain)["hit_rate"])


def test_a_zero_budget_grants_nothing_and_the_table_names_the_hints(agents: Path) -> None:
    code, out = _run(str(agents), "--capacity-tokens", "6000", "--page-size", "16", "--leases", "--lease-budget", "0")
    assert code == 0, out
    assert "with a lease hint" in out and "0/0/0" in out


@pytest.mark.parametrize(
    "extra",
    [["--belady"], ["--replicas", "2"], ["--host-capacity-blocks", "10"], ["--concurrency", "2"], ["--seed", "7"]],
    ids=["belady", "replicas", "tiers", "concurrency", "seed"],  # --seed (for --replicas) was taken and ignored
)
def test_options_leases_do_not_take_are_refused_by_name(agents: Path, extra: list[str]) -> None:
    code, out = _run(str(agents), "--capacity-blocks", "100", "--leases", *extra)
    assert code == 2 and extra[0] in out and "--leases" in out


def test_a_policy_beside_policies_is_refused_with_leases_as_without(agents: Path) -> None:
    """Regression: `--leases --policy agent --policies lru` replayed lru alone and dropped --policy without a word,
    where the same options without --leases are a usage error naming --policy."""
    for leases in ([], ["--leases"]):
        code, out = _run(str(agents), "--capacity-blocks", "100", *leases, "--policy", "agent", "--policies", "lru")
        assert code == 2 and "--policy: not used with --policies" in out, (leases, out)


@pytest.mark.parametrize("budget", ["0.2", "0.5"])  # 0.5, the default, given: it was taken for not given
def test_a_lease_budget_without_leases_is_refused(agents: Path, budget: str) -> None:
    code, out = _run(str(agents), "--capacity-blocks", "100", "--lease-budget", budget)
    assert code == 2 and "--lease-budget is for --leases" in out


def test_a_nan_lease_budget_is_a_usage_error_naming_it(agents: Path) -> None:
    """Regression: NaN passes click's FloatRange(0, 1); it was the replay's 'lease budget must be ...' (exit 1) after
    the trace was read, naming no option."""
    code, out = _run(str(agents), "--capacity-blocks", "100", "--leases", "--lease-budget", "nan")
    assert code == 2 and "--lease-budget" in out


def test_without_leases_the_hinted_policies_repeat_lrus_figures_on_a_hinted_trace(agents: Path) -> None:
    """docs/simulator.md: only --leases tells tlru and agent a request's hint; in a plain run (`--policies all` on an
    agent trace full of hints included) they order as LRU does, so their rows are LRU's, figure for figure."""
    code, out = _run(str(agents), "--capacity-tokens", "6000", "--page-size", "16", "--policies", "lru,tlru,agent",
                     "--no-infinite", "--json")  # fmt: skip
    assert code == 0, out
    runs = {r["name"]: r for r in json.loads(out)["runs"]}
    figures = [(runs[p]["hit_tokens"], runs[p]["evicted_blocks"]) for p in ("lru", "tlru", "agent")]
    assert figures[0][1] > 0 and figures == [figures[0]] * 3
    code, out = _run(str(agents), "--capacity-tokens", "6000", "--page-size", "16", "--leases", "--policies",
                     "lru,tlru,agent", "--json")  # fmt: skip
    runs = {(r["policy"], r["leases"]): r["hit_rate"] for r in json.loads(out)["runs"]}
    assert runs["tlru", True] != runs["lru", True] or runs["agent", True] != runs["lru", True]  # hints heard there
