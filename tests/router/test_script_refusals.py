"""scripts/simulate_balance.py and scripts/simulate_slow_replica.py refuse a bad option or trace in one line, before
any replay: a replica count of 0 or "abc", a load or speed of 0 or nan, a trace with no acceptance setting were
tracebacks (a ValueError, a RadixCacheError from inside a replay, a KeyError), some after the rows before them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.refusals import assert_refused
from tests.router.test_scripts import load_script, tiny_chat


@pytest.mark.parametrize("script", ["simulate_balance.py", "simulate_slow_replica.py"])
@pytest.mark.parametrize("replicas", ["0", "abc", "2,0", "2,4097", ","])
def test_a_replica_count_out_of_range_is_refused_before_any_row(tmp_path: Path, script: str, replicas: str) -> None:
    trace = tiny_chat(tmp_path, name="chat")
    result = CliRunner().invoke(load_script(script).main, [str(trace), "--replicas", replicas])
    output = assert_refused(result, "--replicas", "expected replica counts in [1, 4,096]")
    assert "| chat |" not in output, "no row before the refusal"


@pytest.mark.parametrize(
    ("script", "option", "value"),
    [
        ("simulate_balance.py", "--load", "0"),
        ("simulate_balance.py", "--load", "1,nan"),
        ("simulate_balance.py", "--load", "-2"),
        ("simulate_slow_replica.py", "--slow", "0"),
        ("simulate_slow_replica.py", "--slow", "nan"),
        ("simulate_slow_replica.py", "--slow", "inf"),
    ],
)
def test_a_load_or_speed_that_is_not_a_finite_positive_number_is_refused(
    tmp_path: Path, script: str, option: str, value: str
) -> None:
    trace = tiny_chat(tmp_path, name="chat")
    result = CliRunner().invoke(load_script(script).main, [str(trace), "--replicas", "2", option, value])
    assert_refused(result, option, "expected finite numbers > 0")


def test_the_slow_replica_script_names_a_trace_it_cannot_read_or_has_no_setting_for(tmp_path: Path) -> None:
    main = load_script("simulate_slow_replica.py").main
    assert_refused(CliRunner().invoke(main, [str(tmp_path / "none.jsonl")]), "none.jsonl", "No such file")
    other = tiny_chat(tmp_path, name="other")
    assert_refused(CliRunner().invoke(main, [str(other)]), "no acceptance setting for 'other'")
    result = CliRunner().invoke(main, [str(tiny_chat(tmp_path, name="chat")), "--replicas", "2", "--slow", "0.5"])
    assert result.exit_code == 0, result.output
    assert sum(line.startswith("| chat | 2 |") for line in result.output.splitlines()) == 6  # 3 routers x 2 speeds
