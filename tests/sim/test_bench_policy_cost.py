"""scripts/bench_policy_cost.py: every policy, LRU included, is timed through the radix tree, on a hash trace too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from radixcache.sim.simulation import simulate
from tests.refusals import assert_refused
from tests.sim.conftest import load_script


def write_hash_trace(path: Path) -> Path:
    """A Mooncake-format trace of 60 requests over 10 shared documents: a hash trace, where the simulator's
    default would replay LRU flat."""
    with path.open("w") as out:
        for t in range(60):
            ids = [100 * (t % 10) + i for i in range(4)] + [10_000 + t]
            out.write(json.dumps({"timestamp": t, "input_length": 512 * 5, "output_length": 8, "hash_ids": ids}) + "\n")
    return path


def test_every_policy_is_timed_through_the_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = load_script("bench_policy_cost")
    calls: list[tuple[str, Any]] = []

    def recording_simulate(*args: Any, **kwargs: Any) -> Any:
        calls.append((args[2], kwargs.get("flat", True)))
        return simulate(*args, **kwargs)

    monkeypatch.setattr(script, "simulate", recording_simulate)
    trace = write_hash_trace(tmp_path / "docs.jsonl")

    result = CliRunner().invoke(
        script.main, [str(trace), "--repeats", "2", "--policies", "reuse", "--fractions", "0.2,0.5"]
    )

    assert result.exit_code == 0, result.output
    assert sorted({policy for policy, _ in calls}) == ["lru", "reuse"]
    assert len(calls) == 2 * 2 * 2  # capacities x repeats x policies
    assert all(flat is False for _, flat in calls), calls
    assert "reuse: at most" in result.output


def test_an_unknown_policy_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        load_script("bench_policy_cost").main, [str(write_hash_trace(tmp_path / "t.jsonl")), "--policies", "nope"]
    )
    assert_refused(result, "unknown policy 'nope'")


def test_each_capacity_is_labelled_with_its_own_share(tmp_path: Path) -> None:
    """Regression: the capacities (sorted, merged) were zipped with the fractions as given, so --fractions 0.5,0.2
    labelled the 20-block cache 50% and the 50-block one 20%. The trace has 100 unique blocks (10 documents of 4,
    and 60 one-off last blocks)."""
    trace = write_hash_trace(tmp_path / "docs.jsonl")
    result = CliRunner().invoke(
        load_script("bench_policy_cost").main,
        [str(trace), "--repeats", "1", "--policies", "lru", "--fractions", "0.5,0.2,0.21"],
        terminal_width=200,
    )
    assert result.exit_code == 0, result.output
    rows = [line.split("│")[1:4] for line in result.output.splitlines() if line.startswith("│")]
    shares = [(capacity.strip(), share.strip()) for name, capacity, share in rows if name.strip() == "docs"]
    assert shares == [("20", "20%"), ("21", "21%"), ("50", "50%")]


@pytest.mark.parametrize(
    ("more", "message"),
    [
        (["--fractions", "0"], "--fractions '0': expected finite numbers > 0"),
        (["--fractions", "nan"], "--fractions 'nan': expected finite numbers > 0"),
        (["--fractions", "x"], "--fractions 'x': expected finite numbers > 0"),
        (["no-such-trace.jsonl"], "no-such-trace.jsonl"),  # a second trace, after the good one
    ],
)
def test_bad_fractions_or_traces_are_refused_before_any_timing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, more: list[str], message: str
) -> None:
    """Regression: each was a traceback (ValueError, RadixCacheError, OSError), a bad trace only after every trace
    before it had been timed, losing their rows (the table prints at the end)."""
    script = load_script("bench_policy_cost")
    timed: list[str] = []
    monkeypatch.setattr(script, "simulate", lambda *a, **k: timed.append(a[2]) or simulate(*a, **k))
    trace = str(write_hash_trace(tmp_path / "docs.jsonl"))
    result = CliRunner().invoke(script.main, [trace, *more, "--repeats", "1"])
    assert_refused(result, message)
    assert timed == []
