"""The three study scripts refuse, as a usage error naming the file (and line), a trace they cannot study; and
study_dead_blocks runs on a hash trace whose ids are not chained (a recorded one), as the simulator's Belady does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.refusals import assert_refused
from tests.sim.conftest import SCRIPTS

STUDIES = ["study_dead_blocks", "study_insertion", "study_age_oracle"]


def _run(script: str, trace: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPTS / f"{script}.py"), str(trace), "--block-size", "16", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("script", STUDIES)
def test_a_trace_the_studies_cannot_read_is_a_usage_error(tmp_path: Path, script: str) -> None:
    """A token trace was a KeyError ('hash_ids') or an IndexError from inside the study, a bad line or a missing
    file a TraceError traceback."""
    tokens = _lines(tmp_path / "t.jsonl", [{"timestamp": 0, "tokens": [1, 2, 3], "output_length": 1}])
    assert_refused(_run(script, tokens), f"{tokens}: a token trace; these studies read a Mooncake-format hash trace")
    row = {"timestamp": 0, "input_length": 32, "output_length": 1, "hash_ids": [1, 2]}
    bad = _lines(tmp_path / "bad.jsonl", [row, {**row, "hash_ids": [1, -2]}])
    assert_refused(_run(script, bad), f"{bad}:2: field 'hash_ids'")
    assert_refused(_run(script, tmp_path / "missing.jsonl"), "missing.jsonl")


def test_dead_blocks_runs_on_a_trace_whose_ids_are_not_chained(tmp_path: Path) -> None:
    """Its fresh-dead run took the flat oracle, which only chained ids get (None otherwise): an AttributeError. The
    trie's oracle serves any hash trace, as for the simulator's own Belady."""
    rows = [
        {"timestamp": i, "input_length": 40, "output_length": 9, "hash_ids": [1, 2, 3 + i % 3], "block_size": 16}
        | {"output_hash_ids": [50 + i], "session_id": "s"}
        for i in range(8)
    ]
    result = _run("study_dead_blocks", _lines(tmp_path / "recorded.jsonl", rows), "--fractions", "0.5")
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
