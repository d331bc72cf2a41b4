"""`trace gen KIND -` and `trace convert SRC -` write to stdout (as `replay --json -` does), not a file named '-';
`--record-trace -` is refused."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixcache.cli.main import main


def test_trace_gen_dash_writes_the_trace_to_stdout(runner, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["trace", "gen", "chat", "--count", "3", "--seed", "2"]
    assert runner.invoke(main, [*args[:3], "file.jsonl", *args[3:]]).exit_code == 0
    result = runner.invoke(main, [*args[:3], "-", *args[3:]])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "-").exists()
    assert result.stdout_bytes == (tmp_path / "file.jsonl").read_bytes()  # the same trace, byte for byte
    assert "to stdout" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.jsonl"]  # no staging file left


def test_trace_convert_dash_writes_to_stdout(runner, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert runner.invoke(main, ["trace", "gen", "rag", "src.msgpack", "--count", "2"]).exit_code == 0
    assert runner.invoke(main, ["trace", "convert", "src.msgpack", "back.jsonl"]).exit_code == 0
    result = runner.invoke(main, ["trace", "convert", "src.msgpack", "-"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "-").exists()
    assert result.stdout_bytes == (tmp_path / "back.jsonl").read_bytes()
    packed = runner.invoke(main, ["trace", "convert", "back.jsonl", "-", "--to", "token-msgpack"])
    assert packed.exit_code == 0, packed.output
    assert packed.stdout_bytes == (tmp_path / "src.msgpack").read_bytes()


@pytest.mark.parametrize("command", ["replay", "serve"])
def test_record_trace_dash_is_refused_not_a_file_named_dash(runner, tmp_path: Path, monkeypatch, command) -> None:
    """`--record-trace -` recorded to a file named '-' (and printed `simulate ./-`); '-' is stdout elsewhere."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(main, [command, "--model", str(tmp_path / "no-model"), "--record-trace", "-"])
    assert result.exit_code == 2, result.output
    assert "--record-trace" in result.stderr and "'./-'" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_record_trace_naming_the_file_stdout_is_is_refused(tmp_path: Path, monkeypatch) -> None:
    """`replay --record-trace /dev/stdout > out`: the recording was moved onto out, the table lost with the file it
    went to, and `simulate /dev/stdout` printed; --json may be stdout (the table then goes to stderr)."""
    import click

    from radixcache.cli.record import check_record_path

    out = tmp_path / "out"
    with open(out, "w") as handle:
        monkeypatch.setattr(sys, "stdout", handle)
        with pytest.raises(click.BadParameter, match="is stdout"):
            check_record_path(str(out))
        check_record_path(str(out), "--json")  # no error
        check_record_path(str(tmp_path / "other.jsonl"))


def test_trace_stats_dash_reads_stdin(runner, tmp_path: Path) -> None:
    """`trace gen chat - | trace stats - --format token-jsonl` said '-: open: No such file or directory'."""
    trace = tmp_path / "t.jsonl"
    assert runner.invoke(main, ["trace", "gen", "chat", str(trace), "--count", "2"]).exit_code == 0
    expected = runner.invoke(main, ["trace", "stats", str(trace), "--json"])
    command = [sys.executable, "-c", "from radixcache.cli.main import run; run()", "trace", "stats", "-", "--json"]
    with open(trace, "rb") as stdin:  # a real stdin (the runner's is no file): the environment's imports kept
        piped = subprocess.run([*command, "--format", "token-jsonl"], stdin=stdin, capture_output=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout) == json.loads(expected.stdout)


def test_trace_gen_to_a_closed_or_full_stdout_says_so(tmp_path: Path, monkeypatch) -> None:
    """`trace gen chat - >&-` was 'internal error: AttributeError', `> /dev/full` an error naming no file."""
    import click

    from radixcache.cli.stdout import through_stdout

    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(click.ClickException, match="stdout is closed"), through_stdout():
        pass
    if not Path("/dev/full").exists():
        return
    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        with pytest.raises(OSError) as error, through_stdout() as path:
            Path(path).write_bytes(b"x" * 100_000)
    assert error.value.filename == "stdout"


@pytest.mark.skipif(os.name == "nt", reason="SIGKILL")
def test_a_killed_runs_stdout_file_is_removed_by_the_next_run(tmp_path: Path, monkeypatch) -> None:
    """`trace gen chat - --count 20000 | ...` killed (kill -9) left its whole temporary trace (up to 1.1 GB) in
    the temporary folder for good. The next run that writes to stdout removes it (its pid runs no more, no lock);
    a live run's stays."""
    import tempfile

    from radixcache.cli.stdout import through_stdout

    code = (
        "import sys, time\n"
        "from radixcache.cli.stdout import through_stdout\n"
        "with through_stdout() as path:\n"
        "    open(path, 'wb').write(b'half a trace')\n"
        "    print(path, file=sys.stderr, flush=True)\n"
        "    time.sleep(60)\n"
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)}
        )
        for _ in range(2)
    ]
    try:
        killed, live = (Path(c.stderr.readline().strip()) for c in children)  # type: ignore[union-attr]
        children[0].kill()
        children[0].wait()
        assert killed.parent == tmp_path and killed.read_bytes() == b"half a trace"
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO()))
        with through_stdout() as path:
            Path(path).write_bytes(b"x")
        assert not killed.exists() and live.exists()
    finally:
        children[1].kill()
        children[1].wait()
