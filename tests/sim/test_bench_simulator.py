"""scripts/bench_simulator.py runs end to end on a small generated trace: every run, both modes, the same hit rate
streamed and in memory, and a peak RSS for each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.refusals import assert_refused

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_simulator_small(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    cmd = [sys.executable, str(REPO / "scripts" / "bench_simulator.py"), "--sizes", "3000", "--capacity-blocks", "500"]
    cmd += ["--workdir", str(tmp_path), "--json", str(out), "--markdown", str(tmp_path / "t.md")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    assert {(row["run"], row["mode"]) for row in rows} == {
        (run, mode) for run in ("lru alone", "lru", "lru + belady") for mode in ("streamed", "in memory")
    }
    assert len({row["hit_rate"] for row in rows}) == 1 and all(row["peak_rss_mib"] > 0 for row in rows)
    assert all(row["requests"] == 3000 for row in rows)
    belady = [row["belady_hit_rate"] for row in rows if row["run"] == "lru + belady"]
    assert len(set(belady)) == 1 and belady[0] >= rows[0]["hit_rate"]
    assert "same hit rate: True" in r.stdout


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--sizes", "abc"], "--sizes"),  # a ValueError traceback
        (["--sizes", "0"], "--sizes"),  # an empty trace, then a failed subprocess
        (["--chat", "-1"], "--chat"),  # a CalledProcessError traceback
        (["--capacity-blocks", "0"], "--capacity-blocks"),  # a failed subprocess, after generating the traces
        (["--modes", "bogus"], "--modes"),  # ran streamed, under the name 'bogus'
        (["--belady-max", "-1"], "--belady-max"),
    ],
)
def test_bad_arguments_are_refused_by_name_before_any_trace_is_made(
    tmp_path: Path, args: list[str], option: str
) -> None:
    cmd = [sys.executable, str(REPO / "scripts" / "bench_simulator.py"), "--sizes", "10", "--workdir", str(tmp_path)]
    result = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert_refused(result, f"argument {option}: expected")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("option", ["--json", "--markdown", "--plot"])
@pytest.mark.parametrize("where", ["missing/out", "."])
def test_an_output_it_cannot_write_is_refused_before_any_trace_is_made(tmp_path: Path, option: str, where: str) -> None:
    """Regression: an output in a folder that does not exist (or a folder itself) was a FileNotFoundError or
    IsADirectoryError traceback once every run had finished, minutes of them on the documented sizes."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    cmd = [sys.executable, str(REPO / "scripts" / "bench_simulator.py"), "--sizes", "10", "--workdir", str(workdir)]
    result = subprocess.run([*cmd, option, str(tmp_path / where)], capture_output=True, text=True, timeout=60, cwd=REPO)
    expected = "is a folder" if where == "." else f"the folder {tmp_path / 'missing'} does not exist"
    assert_refused(result, f"argument {option}: ", expected)
    assert list(workdir.iterdir()) == []
