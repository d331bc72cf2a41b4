"""Replay's checks of a token trace read from a file name the record as the trace readers do: `file:line` (JSONL) or
`file: record N (byte B)` (msgpack), not the session and the request's place in it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgpack
import pytest

from radixcache.runtime.engine.engine import Engine
from radixcache.runtime.replay import ReplayConfig, ReplayError, load_replay_trace, replay
from radixcache.trace import read_trace
from radixcache.trace.records import TokenRequest

RECORDS = [
    {"timestamp": 0, "tokens": [1, 2, 3], "output_length": 2, "session": "u1"},
    {"timestamp": 5, "tokens": [1, 2, 3, 4], "output_length": 2, "session": "u2"},
    {"timestamp": 9, "tokens": [1, 2, 999], "output_length": 2, "session": "u1"},  # past the tiny vocabulary (260)
]


@pytest.fixture
def engine(tiny_model_dir: Path) -> Engine:
    return Engine(str(tiny_model_dir))


def test_a_token_outside_the_vocabulary_is_named_at_its_file_and_line(engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in RECORDS[:2]) + "\n\n" + json.dumps(RECORDS[2]) + "\n")
    with pytest.raises(ReplayError, match=re.escape(f"{path}:4: token id 999 is outside the model's vocabulary")):
        replay(engine, load_replay_trace(path), ReplayConfig(max_tokens=2))
    assert engine.stats.requests == 0


def test_a_msgpack_record_is_named_by_its_place_in_the_stream(engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "tokens.msgpack"
    packed = [msgpack.packb(r) for r in RECORDS]
    path.write_bytes(b"".join(packed))
    where = f"{path}: record 2 (byte {len(packed[0]) + len(packed[1])})"
    with pytest.raises(ReplayError, match=re.escape(f"{where}: token id 999")):
        replay(engine, load_replay_trace(path), ReplayConfig(max_tokens=2))


def test_the_place_is_not_part_of_the_request(tmp_path: Path) -> None:
    """A request read from a file equals the same request built in Python, and prints the same."""
    path = tmp_path / "tokens.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n")
    (read,) = read_trace(path).records
    built = TokenRequest(0, (1, 2, 3), 2, session="u1")
    assert read == built and repr(read) == repr(built) and hash(read) == hash(built)
    assert read.source == f"{path}:1" and built.source is None


def test_a_request_built_in_python_is_still_named_by_its_session(engine: Engine) -> None:
    with pytest.raises(ReplayError, match="session request-1 request 1: token id 999"):
        replay(engine, [TokenRequest(0.0, (1, 2, 999), 2)], ReplayConfig())


def test_output_length_0_is_refused_at_its_line_not_run_with_32_tokens(engine: Engine, tmp_path: Path) -> None:
    """The replay took `output_length or None`: 0 ran as no limit, the default 32 tokens. The engine cannot
    generate none, so the request is refused where it was read, before anything runs; --max-tokens (which replaces
    every request's limit) replays it."""
    path = tmp_path / "tokens.jsonl"
    records = [RECORDS[0], {**RECORDS[1], "output_length": 0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ReplayError, match=re.escape(f"{path}:2: output_length is 0")):
        replay(engine, load_replay_trace(path), ReplayConfig())
    assert engine.stats.requests == 0
    result = replay(engine, load_replay_trace(path), ReplayConfig(max_tokens=3, warmup=False))
    assert [r.output_tokens <= 3 for r in result.requests] == [True, True]


def test_output_length_0_through_the_cli_is_an_error_at_its_line(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    from radixcache.cli.main import main

    path = tmp_path / "tokens.jsonl"
    path.write_text(json.dumps({**RECORDS[0], "output_length": 0}) + "\n")
    result = runner.invoke(main, ["replay", str(path), "--model", str(tiny_model_dir)])
    assert result.exit_code == 1, result.output
    assert f"{path}:1: output_length is 0" in result.output and "--max-tokens" in result.output


def test_timestamps_too_far_apart_to_wait_for_are_refused_at_their_line(engine: Engine, tmp_path: Path) -> None:
    """--honor-timestamps slept until each request's time: a gap past what time.sleep takes was an OverflowError
    (an internal error) after the requests before it had run."""
    path = tmp_path / "tokens.jsonl"
    records = [RECORDS[0], {**RECORDS[1], "timestamp": 1e300}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ReplayError, match=re.escape(f"{path}:2: timestamp 1e+300 ms is 1e+297 s after the first")):
        replay(engine, load_replay_trace(path), ReplayConfig(honor_timestamps=True, max_tokens=2))
    assert engine.stats.requests <= 1  # the warm-up at most


def test_a_long_wait_for_timestamps_is_announced_first() -> None:
    from radixcache.runtime.replay.sessions import plan_sessions, start_offsets

    requests = [TokenRequest(0.0, (1, 2), 1), TokenRequest(2 * 3600 * 1000.0, (1, 2, 3), 1)]
    warnings: list[str] = []
    offsets = start_offsets(plan_sessions(requests), True, warnings.append)
    assert sorted(offsets.values()) == [0.0, 7200.0]
    assert warnings == ["the trace's timestamps span 2.0 hours: --honor-timestamps replays it that slowly"]


def test_a_skipped_token_request_is_named_with_its_file_and_line(engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"
    records = [RECORDS[0], {**RECORDS[1], "tokens": [5] * engine.config.max_position}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    warnings: list[str] = []
    result = replay(engine, load_replay_trace(path), ReplayConfig(max_tokens=2), on_warning=warnings.append)
    assert len(result.requests) == 1 and len(result.skipped) == 1
    assert warnings[0].startswith(f"conversation u2 turn 1 ({path}:2): 4,096 prompt tokens do not fit")
