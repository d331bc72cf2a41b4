"""A JSONL line longer than any trace record (radixcache.trace.jsonl.MAX_LINE_BYTES) is refused at its file:line once
that much of it is read, by every reader and every peek at a first line: not read whole, decoded and parsed first
(a 300 MB line took 3 GB and over a minute to refuse)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

import radixcache.trace.jsonl as jsonl
from radixcache.cli.main import main
from radixcache.sim.source import open_source
from radixcache.trace import TraceError, detect_format, iter_trace, read_trace
from tests.refusals import assert_refused

LIMIT = 4096
OK = b'{"timestamp": 0, "input_length": 1024, "output_length": 2, "hash_ids": [1, 2]}\n'


@pytest.fixture(autouse=True)
def small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", LIMIT)


def _long_line(ids: int) -> bytes:
    return b'{"timestamp": 1, "input_length": 1024, "output_length": 2, "hash_ids": [' + b"7, " * ids + b"1]}\n"


@pytest.mark.parametrize("fmt", [None, "mooncake"])
def test_a_line_past_the_limit_is_refused_at_its_line(tmp_path: Path, fmt: str | None) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(OK + _long_line(LIMIT))
    with pytest.raises(TraceError, match=rf"t\.jsonl:2: a line longer than {LIMIT:,} bytes"):
        list(iter_trace(path, fmt))


def test_a_line_at_the_limit_is_read(tmp_path: Path) -> None:
    """The limit is on the line without its newline: a line of exactly LIMIT bytes reads, with or without one."""
    line = OK.rstrip(b"\n")[:-2] + b"]}"  # the same record
    body = line[:-2] + b" " * (LIMIT - len(line)) + b"]}"  # padded with spaces to LIMIT bytes
    assert len(body) == LIMIT
    for ending in (b"\n", b""):
        path = tmp_path / "t.jsonl"
        path.write_bytes(OK + body + ending)
        assert [r.hash_ids for r in iter_trace(path)] == [(1, 2), (1, 2)]


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "{path}", "--capacity-blocks", "4"],
        ["simulate", "{path}", "--capacity-blocks", "4", "--in-memory"],
        ["simulate", "{path}", "--capacity-blocks", "4", "--replicas", "2"],
        ["trace", "stats", "{path}"],
    ],
)
def test_the_commands_refuse_it_at_its_line(tmp_path: Path, args: list[str]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(OK + _long_line(LIMIT))
    result = CliRunner().invoke(main, [a.format(path=path) for a in args])
    assert_refused(result, f"{path}:2: a line longer than {LIMIT:,} bytes")


def test_a_first_line_past_the_limit_cannot_be_detected(tmp_path: Path) -> None:
    """Detection peeks at the first line: one past the limit is refused as such (--format has the reader say where)."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(_long_line(LIMIT) + OK)
    with pytest.raises(TraceError, match="cannot detect the format: its first line is over"):
        detect_format(path)
    with pytest.raises(TraceError, match=r"t\.jsonl:1: a line longer than"):
        read_trace(path, "mooncake")
    assert open_source(path, "mooncake").span() is None  # the peek gives up, and the replay reports the line
    with pytest.raises(TraceError, match=r"t\.jsonl:1: a line longer than"):
        open_source(path, "mooncake").count()


def test_refusing_a_long_line_holds_about_the_limit_not_the_line(tmp_path: Path) -> None:
    """A line 500 times the limit: the refusal allocates a few times the limit, never the line (3 MB here)."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(OK + _long_line(500 * LIMIT // 3))
    assert path.stat().st_size > 500 * LIMIT
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match="a line longer than"):
            list(iter_trace(path, "mooncake"))
        with pytest.raises(TraceError, match="a line longer than"):
            list(iter_trace(path))  # the peeks too
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * LIMIT
