"""Reading back `radixcache replay --json`: a field of the wrong type or value is a TraceError naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.trace import TraceError
from radixcache.trace.replay_output import read_replay_json, replay_stats

RECORD = {
    "conversation": "a",
    "turn": 0,
    "prompt_tokens": 10,
    "cached_tokens": 5,
    "prefill_tokens": 5,
    "output_tokens": 3,
    "ttft_s": 0.1,
    "latency_s": 0.5,
}


def write(path: Path, summary: dict, record: dict) -> Path:
    # json.dumps writes NaN and Infinity as json.load reads them back
    path.write_text(json.dumps({"summary": summary, "requests": [record]}, indent=2))
    return path


def test_a_sound_file_gives_its_statistics(tmp_path: Path) -> None:
    summary = {"label": "cache", "model": "m", "mode": "chat", "wall_s": 2.5, "skipped_too_long": 1}
    stats = replay_stats(read_replay_json(write(tmp_path / "r.json", summary, RECORD)))
    assert (stats["hit_rate"], stats["wall_s"], stats["skipped"], stats["run"]) == (0.5, 2.5, 1, "cache")


@pytest.mark.parametrize(
    ("summary", "record", "field"),
    [
        ({"wall_s": None}, {}, "summary.wall_s"),
        ({"wall_s": float("inf")}, {}, "summary.wall_s"),
        ({"skipped_too_long": None}, {}, "summary.skipped_too_long"),
        ({"skipped_kv_full": [1]}, {}, "summary.skipped_kv_full"),
        ({"label": {"a": 1}}, {}, "summary.label"),
        ({}, {"ttft_s": float("nan")}, "requests[0].ttft_s"),
        ({}, {"latency_s": float("inf")}, "requests[0].latency_s"),
        ({}, {"prompt_tokens": -10}, "requests[0].prompt_tokens"),
    ],
)
def test_a_bad_summary_or_record_field_is_named(tmp_path: Path, summary: dict, record: dict, field: str) -> None:
    """These were read: the table or the statistics failed with a TypeError (an 'internal error'), or --json wrote
    NaN and Infinity, which is not JSON, or a negative hit rate."""
    path = write(tmp_path / "r.json", summary, {**RECORD, **record})
    with pytest.raises(TraceError) as info:
        read_replay_json(path)
    assert info.value.field == field
    for args in ([], ["--json"]):
        result = CliRunner().invoke(main, ["trace", "stats", str(path), *args])
        assert result.exit_code == 1 and f"field '{field}'" in result.stderr and "internal" not in result.stderr


def test_a_byte_that_is_not_utf8_is_named_with_its_line(tmp_path: Path) -> None:
    """json.load's UnicodeDecodeError came out bare: `error: 'utf-8' codec can't decode byte 0xff`, no file, no line."""
    path = write(tmp_path / "r.json", {"label": "cache"}, {**RECORD, "conversation": "@"})
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b'"@"', b'"\xff"'))
    line = raw[: raw.index(b'"@"')].count(b"\n") + 1
    with pytest.raises(TraceError, match=rf"r\.json:{line}: not UTF-8 text"):
        read_replay_json(path)
    result = CliRunner().invoke(main, ["trace", "stats", str(path)])
    assert result.exit_code == 1 and f"r.json:{line}: not UTF-8 text" in result.stderr


@pytest.mark.parametrize("indent", [2, None])  # replay writes it indented; a one-line copy is still one
@pytest.mark.parametrize("command", ["simulate", "convert"])
def test_a_trace_command_on_replay_output_names_it_as_such(tmp_path: Path, command: str, indent) -> None:
    """`simulate r.json` said 'cannot detect the format: invalid JSON' of the file trace stats reads."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"summary": {"label": "cache"}, "requests": [RECORD]}, indent=indent))
    if command == "simulate":
        args = ["simulate", str(path), "--capacity-blocks", "10"]
    else:
        args = ["trace", "convert", str(path), str(tmp_path / "out.jsonl")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    assert "output of 'radixcache replay --json', not a trace" in result.output
    assert "trace stats" in result.output and "invalid JSON" not in result.output
