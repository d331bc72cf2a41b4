"""scripts/bench_server.py runs end to end: its own servers with the cache on and off, and a running one (--url)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(REPO / "scripts" / "bench_server.py"), "--limit", "1", "--max-tokens", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.slow
def test_on_and_off_rows_with_the_hit_rate_from_metrics(tiny_model_dir) -> None:
    r = _bench("--model", str(tiny_model_dir), "--concurrency", "2")
    assert r.returncode == 0, r.stderr
    rows = {line.split("|")[1].strip(): line for line in r.stdout.splitlines() if line.startswith("| o")}
    assert set(rows) == {"on", "off"} and "| 0.0% |" in rows["off"] and "| 0.0% |" not in rows["on"]
    assert "throughput on/off" in r.stdout


def test_url_measures_a_running_server(server) -> None:
    r = _bench("--url", server.url, "--served-model-name", "tiny", "--trace", "synthetic")
    assert r.returncode == 0, r.stderr
    assert "| as served | 4 |" in r.stdout
