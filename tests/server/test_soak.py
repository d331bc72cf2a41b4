"""A short soak (scripts/soak_server.py): mixed traffic from many clients, cancels mid-stream, bad requests and
overload; no 500, every stream ends with [DONE], no block leaks and the cache's invariants hold afterwards. The
full soak (64 clients, 3 minutes, SmolLM2) is the same script with its defaults: docs/server.md."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_soak_has_no_500_no_leak_and_invariants_hold(tiny_model_dir) -> None:
    cmd = [sys.executable, str(REPO / "scripts" / "soak_server.py"), "--model", str(tiny_model_dir)]
    cmd += ["--clients", "12", "--duration", "5", "--warmup", "1", "--max-queue", "4", "--queue-timeout", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: no 500" in r.stdout
    rows = [line.split("|") for line in r.stdout.splitlines() if line.startswith("| ")]
    outcomes = {cells[1].strip(): int(cells[2]) for cells in rows if cells[2].strip().isdigit()}
    assert outcomes.get("chat 200", 0) > 0 and outcomes.get("stream 200", 0) > 0
    assert outcomes.get("bad 400", 0) > 0 and outcomes.get("stream-cancel closed", 0) > 0
    assert "FAILURE" not in outcomes
