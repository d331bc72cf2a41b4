"""scripts/bench_busy_replay.py end to end on the tiny model: every (load, policy) pair runs a real `radixcache
replay` process, the report and JSON carry each, the policy reaches the engine (the replay's own JSON), and the
background jobs it started are gone afterwards (killed by their process group, nothing else touched)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _running_in_group(pgid: int) -> list[int]:
    """Processes of group `pgid` that still run (zombies left to an init that does not reap them do not count)."""
    running = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue  # it ended while being read
        if int(fields[2]) == pgid and fields[0] != "Z":
            running.append(int(stat.parent.name))
    return running


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="the compile load needs a C compiler")
def test_bench_busy_replay_runs_each_pair_and_leaves_no_job_behind(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "busy.json"
    cmd = [sys.executable, str(REPO / "scripts" / "bench_busy_replay.py"), "--model", str(tiny_model_dir)]
    # --settle 0: no wait beside the jobs (2 s before and after each busy run by default, 8 s of this test); the
    # replay's own start (a Python process importing torch) keeps the job's compiler running before it is killed.
    # --threads 1: the pairs, the report and the jobs' end do not depend on the count, and two threads beside the
    # job and the other xdist worker of a 2-core machine wait at every OpenMP barrier (the issue this script measures)
    cmd += ["--limit", "1", "--rounds", "1", "--jobs", "1", "--load", "compile", "--settle", "0", "--threads", "1"]
    cmd += ["--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {"idle/adaptive", "idle/fixed", "busy/adaptive", "busy/fixed"}
    for runs in result["runs"].values():
        assert len(runs) == 1 and runs[0]["wall_s"] > 0 and runs[0]["decode_tps"] > 0
    assert "| adaptive | busy |" in r.stdout and "| fixed | idle |" in r.stdout
    assert "adaptive against fixed" in r.stdout
    assert len(result["load_groups"]) == 2  # one job for each of the round's two busy runs
    assert not [p for g in result["load_groups"] for p in _running_in_group(g)]  # the job and its compiler


@pytest.mark.parametrize(
    ("args", "named"),
    [(["--jobs", "0"], "--jobs, --rounds and --threads must be >= 1"), (["--settle", "-1"], "--settle must be")],
)
def test_bench_busy_replay_refuses_nonsense_counts(args: list[str], named: str) -> None:
    cmd = [sys.executable, str(REPO / "scripts" / "bench_busy_replay.py"), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and named in r.stderr
