"""scripts/bench_mirror_fill.py: a real run on SmolLM2's shape, alone and in a real Engine, prints one row per (busy
level, length) with both fills timed (32 positions and the new token fill a third page), and a bad value is a usage
error before torch loads."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.import_log import IMPORTTIME, imported
from tests.cli.run_here import run_script_in_process

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench_mirror_fill.py"


def _run(*args: str, python: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [*(python or [sys.executable]), str(SCRIPT), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_a_small_run_times_both_fills_for_each_length(capsys: pytest.CaptureFixture[str]) -> None:
    stdout = run_script_in_process(
        SCRIPT, ["--positions", "20,32", "--busy", "0", "--rounds", "2", "--threads", "1"], capsys
    )
    rows = re.findall(r"^\| (\d+) \| 0 \| ([\d.]+), ([\d.]+) \| ([\d.]+), ([\d.]+) \| ([\d.]+)x \|$", stdout, re.M)
    assert [row[0] for row in rows] == ["20", "32"], stdout
    for _, *numbers in rows:
        assert all(float(v) > 0 for v in numbers)


def test_a_bad_value_is_a_usage_error_before_torch_loads() -> None:
    r = _run("--positions", "512,0", python=IMPORTTIME)
    assert r.returncode == 2 and "--positions" in r.stderr and "expected an int >= 1, got '0'" in r.stderr
    assert "torch" not in imported(r.stderr)


def test_the_engine_mode_times_both_fills_inside_a_real_engines_steps() -> None:
    r = _run("--engine", "--positions", "24", "--busy", "0", "--rounds", "1", "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert "# in an Engine: SmolLM2 gguf, 1 fixed threads" in r.stdout
    row = re.search(r"^\| 24 \| 0 \| ([\d.]+), [\d.]+ \| ([\d.]+), [\d.]+ \| [\d.]+x \|$", r.stdout, re.M)
    assert row and float(row[1]) > 0 and float(row[2]) > 0, r.stdout  # each generate's step filled a row
