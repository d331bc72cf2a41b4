"""scripts/bench_goodput.py runs end to end against the tiny checkpoint: both modes, open-loop Poisson load, with
numbers that add up (every request sent is completed, refused or cut; goodput <= throughput <= offered)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RATE, DURATION = 4.0, 1.0  # the seeded arrivals: 3 requests a mode


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sweep_both_modes_with_consistent_numbers(tiny_model_dir: Path, tmp_path: Path) -> None:
    out, md, png = tmp_path / "out.json", tmp_path / "out.md", tmp_path / "out.png"
    cmd = [sys.executable, str(REPO / "scripts" / "bench_goodput.py"), "--model", str(tiny_model_dir)]
    cmd += ["--rates", "4", "--duration", "1", "--max-tokens", "4", "--max-queue", "1", "--queue-timeout", "2"]
    cmd += ["--json", str(out), "--markdown", str(md), "--plot", str(png)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr

    rows = {row["mode"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"unbounded", "limited"}
    lines = {line.split("|")[1].strip(): line for line in r.stdout.splitlines() if line.startswith("| ")}
    assert {"unbounded", "limited"} <= set(lines)
    assert md.read_text().strip() in r.stdout and png.stat().st_size > 0
    assert "rate 4 req/s: goodput limited / unbounded" in r.stdout

    sent = {row["sent"] for row in rows.values()}
    assert len(sent) == 1 and sent.pop() > 0  # the same seeded arrivals in both modes
    for mode, row in rows.items():
        assert row["rate"] == RATE and row["duration"] == DURATION, mode
        assert row["errors"] == 0 and row["server_errors"] == 0, row
        parts = row["completed"] + row["rejected_429"] + row["rejected_503"] + row["errors"] + row["cut"]
        assert parts == row["sent"], row
        assert 0 <= row["good"] <= row["completed"] <= row["sent"], row
        for key in ("frac_429", "frac_503"):
            assert 0.0 <= row[key] <= 1.0, (key, row)
        assert row["frac_429"] + row["frac_503"] <= 1.0, row
        assert row["offered"] == pytest.approx(row["sent"] / DURATION)
        assert row["goodput"] <= row["throughput"] <= row["offered"] <= RATE * 3, row
        assert 0.0 <= row["ttft_p50"] <= row["ttft_p99"], row
        if row["completed"]:
            assert row["ttft_p99"] > 0, row
    # Without limits nothing is refused; every request is eventually served.
    assert rows["unbounded"]["rejected_429"] == rows["unbounded"]["rejected_503"] == 0
    assert rows["unbounded"]["completed"] == rows["unbounded"]["sent"]
