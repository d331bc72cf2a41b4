"""Sizes past what a trace could hold (MAX_TOKENS token ids for a length, for what a generator makes up front and
for one conversation's prompts) are refused by name when a generator is called: they made ids for hours before the
first request (trace gen wrote nothing), and demo's workload, held whole, is bounded too."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.trace.generator_args import MAX_TOKENS, MAX_UNITS
from radixcache.trace.synthetic import GENERATORS

HUGE = 10**30


@pytest.mark.parametrize(
    ("name", "args", "named"),
    [
        ("chat", {"system_tokens": HUGE}, "system_tokens"),
        ("chat", {"system_tokens": 99999999999999999}, "system_tokens"),
        ("chat", {"system_prompts": HUGE}, "system_prompts x system_tokens"),
        ("chat", {"turns": (1, HUGE)}, "a conversation's prompts"),
        ("chat", {"system_prompts": 1, "system_tokens": MAX_TOKENS // 2, "turns": (3, 3)}, "a conversation's prompts"),
        ("agent", {"tool_prompts": HUGE}, "tool_prompts x tool_tokens"),
        ("agent", {"steps": (1, HUGE)}, "an agent's prompts"),
        ("agent", {"fanout": (1, HUGE)}, "an agent's prompts"),
        ("rag", {"documents": HUGE}, "documents x doc_tokens"),
        ("rag", {"doc_tokens": MAX_TOKENS // 4}, "documents x doc_tokens"),
        ("few-shot", {"tasks": HUGE}, "tasks x"),
        ("few-shot", {"batch_size": (1, HUGE)}, "a batch's prompts"),
        ("agent-sessions", {"agents": 1, "steps": (2, 2), "tools_tokens": MAX_TOKENS + 1}, "tools_tokens"),
        ("agent-sessions", {"agents": HUGE}, "agents x an agent's prompts"),
        ("agent-sessions", {"agents": 1, "steps": (1, HUGE)}, "an agent's prompts"),
    ],
)
def test_sizes_past_max_tokens_are_refused_by_name_on_the_call(name: str, args: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        next(iter(GENERATORS[name](**args)))  # lazy generators: the first request would have hung


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_the_defaults_are_well_within_the_bounds(name: str) -> None:
    assert sum(1 for _ in GENERATORS[name]()) > 0


def test_trace_gen_names_the_parameter_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    args = ["trace", "gen", "chat", str(out), "--set", "system_tokens=99999999999999999"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "--set system_tokens" in result.output and "16,777,216" in result.output
    assert not out.exists()


def test_demo_bounds_the_conversations_it_holds() -> None:
    result = CliRunner().invoke(main, ["demo", "--conversations", str(10**20)])
    assert result.exit_code == 2 and "--conversations" in result.output


@pytest.mark.parametrize(
    ("name", "field"),
    [
        ("chat", "mean_think_ms"),
        ("chat", "mean_interarrival_ms"),
        ("agent", "mean_step_ms"),
        ("agent-sessions", "mean_interarrival_ms"),
        ("rag", "mean_interarrival_ms"),
        ("few-shot", "mean_interarrival_ms"),
    ],
)
def test_a_mean_time_whose_timestamps_the_readers_refuse_is_refused_on_the_call(name: str, field: str) -> None:
    """A mean of 1e308 ms put the second request's timestamp past MAX_TIMESTAMP_MS: trace gen failed there."""
    with pytest.raises(ValueError, match=field):
        next(iter(GENERATORS[name](**{field: 1e308})))


def test_trace_gen_refuses_such_a_mean_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    result = CliRunner().invoke(main, ["trace", "gen", "chat", str(out), "--set", "mean_think_ms=1e308"])
    assert result.exit_code == 2 and "--set mean_think_ms" in result.output and "request 2" not in result.output


@pytest.mark.timeout(60)  # without the bound it made the whole trace first: hours
def test_agent_sessions_bounds_the_whole_trace_it_holds() -> None:
    """agent_sessions makes every request before the first: 2**24 agents (each within the bounds) held ~7e11 ids."""
    with pytest.raises(ValueError, match=r"agents x an agent's prompts may reach .* at most 268,435,456 \(2\*\*28\)"):
        GENERATORS["agent-sessions"](agents=2**24)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("chat", "conversations"),
        ("agent", "agents"),
        ("rag", "queries"),
        ("few-shot", "batches"),
    ],
)
def test_a_unit_count_past_max_units_is_refused_by_name_on_the_call(name: str, key: str) -> None:
    with pytest.raises(ValueError, match=f"{key} <= 1,048,576"):
        next(iter(GENERATORS[name](**{key: MAX_UNITS + 1})))


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--count", str(2**63 - 1)], "--count"),
        (["--set", f"conversations={2**63 - 1}"], "--set"),
        (["--count", str(MAX_UNITS + 1)], "--count"),
    ],
)
def test_trace_gen_refuses_a_huge_count_as_a_usage_error_before_writing(tmp_path: Path, args, named: str) -> None:
    # --count 2**63-1 wrote until the disk filled (7.9 GB in 20 minutes)
    out = tmp_path / "x.jsonl"
    result = CliRunner().invoke(main, ["trace", "gen", "chat", str(out), *args])
    assert result.exit_code == 2 and named in result.output and "1048576" in result.output.replace(",", "")
    assert not out.exists() and list(tmp_path.iterdir()) == []


_COUNT_KEYS = {"chat": "conversations", "agent": "agents", "agent-sessions": "agents", "rag": "queries"}


@pytest.mark.parametrize("kind", sorted(GENERATORS))
@pytest.mark.parametrize("how", ["--count", "--set"])
def test_trace_gen_refuses_a_count_of_zero_as_a_usage_error_before_writing(tmp_path: Path, kind: str, how: str) -> None:
    """It wrote an empty file, which `trace stats` and `simulate` then refused: no record to detect the format by."""
    out = tmp_path / "x.jsonl"
    args = ["--count", "0"] if how == "--count" else ["--set", f"{_COUNT_KEYS.get(kind, 'batches')}=0"]
    result = CliRunner().invoke(main, ["trace", "gen", kind, str(out), *args])
    assert result.exit_code == 2 and how in result.output, result.output
    assert list(tmp_path.iterdir()) == []
