"""A trace from a pipe: `cat trace.jsonl | radixcache simulate -` (and `trace stats -`, `trace convert -`) reads it as
it reads the file, and errors name `<stdin>:N` and the field (cli/piped_trace.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.trace import HashRequest, write_mooncake
from tests.refusals import assert_refused


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    """Sessions whose turns share their first blocks, so a cache of 16 blocks hits and evicts."""
    path = tmp_path / "t.jsonl"
    requests = [HashRequest(10 * i, 3 * 512, 4, (i % 5, 100 + i % 5, 200 + i)) for i in range(40)]
    write_mooncake(path, requests)
    return path


def invoke(args: list[str], stdin: bytes | None = None):
    return CliRunner().invoke(main, args, input=stdin)


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--in-memory", "--belady"],
        ["--replicas", "2", "--rate", "3"],
        ["--leases"],
        ["--policies", "lru,fifo"],
        ["--host-capacity-blocks", "6"],
    ],
)
def test_simulate_dash_reads_stdin_as_it_reads_the_file(trace: Path, extra: list[str]) -> None:
    """Regression: `cat t.jsonl | radixcache simulate -` said '-: open: No such file or directory', and /dev/stdin
    was refused as no regular file. The piped trace gives the file's figures to the digit."""
    args = ["--capacity-blocks", "16", "--json", *extra]
    expected = invoke(["simulate", str(trace), *args])
    assert expected.exit_code == 0, expected.output
    piped = invoke(["simulate", "-", *args], trace.read_bytes())
    assert piped.exit_code == 0, piped.output
    drop = {"seconds", "elapsed_s"}  # wall times

    def figures(value: object) -> object:
        if isinstance(value, dict):
            return {k: figures(v) for k, v in value.items() if k not in drop}
        return [figures(v) for v in value] if isinstance(value, list) else value

    assert figures(json.loads(piped.stdout)) == figures(json.loads(expected.stdout))
    assert json.loads(piped.stdout)["hit_rate" if "runs" not in piped.stdout else "runs"]


def test_the_table_names_stdin(trace: Path) -> None:
    result = invoke(["simulate", "-", "--capacity-blocks", "16"], trace.read_bytes())
    assert result.exit_code == 0, result.output
    assert "<stdin>: 40 requests" in result.stdout and "radixcache-trace-" not in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "-", "--capacity-blocks", "16"],
        ["simulate", "-", "--capacity-blocks", "16", "--in-memory"],
        ["simulate", "-", "--capacity-blocks", "16", "--replicas", "2"],
        ["simulate", "-", "--capacity-blocks", "16", "--leases"],
        ["simulate", "-", "--capacity-blocks", "16", "--policies", "lru,fifo"],
        ["trace", "stats", "-"],
        ["trace", "convert", "-", "out.jsonl"],
    ],
)
def test_a_bad_line_in_a_pipe_is_named_stdin_and_its_line(trace: Path, args: list[str], tmp_path: Path) -> None:
    """Each reader's error names `<stdin>:N` and the field: not the temporary copy's path, nor /dev/stdin."""
    bad = trace.read_bytes() + b'{"timestamp": 900, "input_length": 512, "output_length": 1, "hash_ids": [1.5]}\n'
    args = [str(tmp_path / a) if a == "out.jsonl" else a for a in args]
    out = assert_refused(invoke(args, bad), "<stdin>:41: field 'hash_ids': item 0 is 1.5")
    assert "radixcache-trace-" not in out
    assert not (tmp_path / "out.jsonl").exists()


def test_an_empty_pipe_is_an_empty_file() -> None:
    assert_refused(invoke(["simulate", "-", "--capacity-blocks", "16"], b""), "<stdin>:1: empty file")
    assert_refused(invoke(["trace", "stats", "-"], b""), "<stdin>:1: empty file")


def test_a_named_pipe_is_read_once_and_replayed_whole(trace: Path) -> None:
    """Regression: `radixcache simulate <(cat t.jsonl)` (a pipe, /dev/fd/N) was refused as no regular file (before
    that, it replayed 0 requests at 0%: the replay reads its trace more than once). It is copied once, and named by
    its own path."""
    expected = invoke(["simulate", str(trace), "--capacity-blocks", "16", "--json"])
    read, write = os.pipe()
    os.write(write, trace.read_bytes())
    os.close(write)
    try:
        piped = invoke(["simulate", f"/dev/fd/{read}", "--capacity-blocks", "16", "--json"])
    finally:
        os.close(read)
    assert piped.exit_code == 0, piped.output
    assert json.loads(piped.stdout)["hit_tokens"] == json.loads(expected.stdout)["hit_tokens"] > 0


def test_trace_stats_dash_detects_the_format(trace: Path) -> None:
    """`cat t.jsonl | radixcache trace stats -` needed --format (detection read the pipe's head, which the reader
    then lacked); the copy is detected as the file is."""
    expected = invoke(["trace", "stats", str(trace), "--json"])
    piped = invoke(["trace", "stats", "-", "--json"], trace.read_bytes())
    assert piped.exit_code == 0, piped.output
    assert json.loads(piped.stdout) == json.loads(expected.stdout)
