"""`trace gen --set NAME=VALUE` with hostile values, for every key of every generator: a value out of range or of the
wrong type is a usage error (exit 2) naming `--set NAME`, as other options are, before the file is made. Out-of-range
ones exited 1, as if the run had failed, though the message named the parameter."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.trace.synthetic import GENERATORS

HUGE = str(10**30)
#: values every key refuses: not finite, not a number, or past every bound (the seed takes any int)
REFUSED = ["nan", "inf", "-inf", "abc", HUGE]
#: values some keys take (a length of 0, a zipf exponent of -1, a seed); refused, they name the key too
EITHER = ["-1", "0", "1e300", "1.5"]
COUNTS = ("conversations", "agents", "queries", "batches")
KEYS = [(kind, name) for kind in sorted(GENERATORS) for name in inspect.signature(GENERATORS[kind]).parameters]


def gen(tmp_path: Path, kind: str, name: str, value: str) -> tuple[int, str]:
    default = inspect.signature(GENERATORS[kind]).parameters[name].default
    raw = f"{value},{value}" if isinstance(default, tuple) else value  # a pair: both ends
    count = [] if name in COUNTS else ["--count", "1"]  # the count's key is the count: --count beside it is refused
    result = CliRunner().invoke(
        main, ["trace", "gen", kind, str(tmp_path / "x.jsonl"), *count, "--set", f"{name}={raw}"]
    )
    return result.exit_code, result.output


@pytest.mark.parametrize(("kind", "name"), KEYS)
def test_a_hostile_set_value_is_a_usage_error_naming_the_key(tmp_path: Path, kind: str, name: str) -> None:
    for value in REFUSED + EITHER:
        code, output = gen(tmp_path, kind, name, value)
        if name == "seed" and value in (HUGE, "-1", "0"):
            assert code == 0, (value, output)  # any int seeds
        elif value in REFUSED:
            assert code == 2 and f"--set {name}" in output, (value, output)
        else:
            assert code in (0, 2) and (code == 0 or f"--set {name}" in output), (value, output)
        assert code == 0 or list(tmp_path.iterdir()) == [], (value, output)  # refused before the file is made
        (tmp_path / "x.jsonl").unlink(missing_ok=True)


@pytest.mark.parametrize("kind", sorted(GENERATORS))
@pytest.mark.parametrize("item", ["nope=1", "=1", "turns", "mean_think_ms="])
def test_an_unknown_or_malformed_set_item_is_a_usage_error_naming_set(tmp_path: Path, kind: str, item: str) -> None:
    result = CliRunner().invoke(main, ["trace", "gen", kind, str(tmp_path / "x.jsonl"), "--set", item])
    assert result.exit_code == 2 and "--set" in result.output and list(tmp_path.iterdir()) == []


def test_a_bound_of_the_count_with_the_defaults_names_count(tmp_path: Path) -> None:
    # agent_sessions holds its whole trace: 100,000 agents at the defaults pass 2**28 token ids
    result = CliRunner().invoke(
        main, ["trace", "gen", "agent-sessions", str(tmp_path / "x.jsonl"), "--count", "100000"]
    )
    assert result.exit_code == 2 and "--count" in result.output and "2**28" in result.output


@pytest.mark.parametrize(
    ("args", "named", "other"),
    [
        (["--count", "2", "--set", "queries=5"], "--set queries", "--count"),
        (["--seed", "1", "--set", "seed=3"], "--set seed", "--seed"),
        (["--set", "zipf=1", "--set", "zipf=2"], "--set zipf", "--set zipf"),
    ],
)
def test_a_parameter_given_twice_is_a_usage_error_naming_both(
    tmp_path: Path, args: list[str], named: str, other
) -> None:
    # the last one was taken without a word: --count 2 --set queries=5 wrote 5 queries, --seed 1 --set seed=3 seed 3
    result = CliRunner().invoke(main, ["trace", "gen", "rag", str(tmp_path / "x.jsonl"), *args])
    assert result.exit_code == 2 and named in result.output and f"set by {other} too" in result.output, result.output
    assert list(tmp_path.iterdir()) == []


def test_set_alone_still_sets_the_count_and_the_seed(tmp_path: Path) -> None:
    by_set, by_options = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert (
        CliRunner()
        .invoke(main, ["trace", "gen", "rag", str(by_set), "--set", "queries=3", "--set", "seed=4"])
        .exit_code
        == 0
    )
    assert (
        CliRunner().invoke(main, ["trace", "gen", "rag", str(by_options), "--count", "3", "--seed", "4"]).exit_code == 0
    )
    assert by_set.read_bytes() == by_options.read_bytes() and len(by_set.read_text().splitlines()) == 3
