"""scripts/bench_mirror_fill.py: a real run on SmolLM2's shape prints one row per (busy level, length) with both
fills timed, and a bad value is a usage error before torch loads."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.cli.import_log import IMPORTTIME, imported

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench_mirror_fill.py"


def _run(*args: str, python: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [*(python or [sys.executable]), str(SCRIPT), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_a_small_run_times_both_fills_for_each_length() -> None:
    r = _run("--positions", "20,45", "--busy", "0", "--rounds", "2", "--threads", "1")
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^\| (\d+) \| 0 \| ([\d.]+), ([\d.]+) \| ([\d.]+), ([\d.]+) \| ([\d.]+)x \|$", r.stdout, re.M)
    assert [row[0] for row in rows] == ["20", "45"], r.stdout
    for _, *numbers in rows:
        assert all(float(v) > 0 for v in numbers)


def test_a_bad_value_is_a_usage_error_before_torch_loads() -> None:
    r = _run("--positions", "512,0", python=IMPORTTIME)
    assert r.returncode == 2 and "--positions" in r.stderr and "expected an int >= 1, got '0'" in r.stderr
    assert "torch" not in imported(r.stderr)
