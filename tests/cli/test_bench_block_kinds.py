"""scripts/bench_block_kinds.py at tiny sizes: every (threads, kind, kernel, tokens) asked for is measured in every
round, the table and the JSON carry each, and bad arguments exit 2 naming what was wrong, before torch loads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.import_log import IMPORTTIME, imported
from tests.cli.run_here import run_script_in_process

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "bench_block_kinds.py"

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler here")


def _run(*args: str, python: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    command = [*(python or [sys.executable]), str(SCRIPT), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def test_every_measurement_runs_and_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "kinds.json"
    args = ["--rows", "32", "--cols", "512", "--kinds", "Q4_1,Q4_K,Q6_K", "--tokens", "1,3", "--threads", "1,2"]
    # --bandwidth-mb 32: the reading is made and reported as with the default 512 MB (whose page faults took 1.2 s
    # of each of the four readings), what it reads is not asserted
    stdout = run_script_in_process(
        SCRIPT, [*args, "--rounds", "2", "--calls", "2", "--bandwidth-mb", "32", "--json", str(out)], capsys
    )
    data = json.loads(out.read_text())
    assert len(data["rounds"]) == 2
    kernels = ("float", "int16", "int8")
    keys = {f"{t}/{k}/{kernel}" for t in (1, 2) for k in ("Q4_1", "Q4_K", "Q6_K") for kernel in kernels}
    keys = {f"{key}/{n}" for key in keys for n in (1, 3)}
    for rd in data["rounds"]:
        assert set(rd["ms"]) == keys and all(v > 0 for v in rd["ms"].values())
        assert all(bw > 0 for bw in rd["bandwidth"].values())
    assert len(data["summary"]) == 2 * 3 * 2
    table = [line for line in stdout.splitlines() if line.startswith("| ") and "Q" in line]
    assert len(table) == 12 and all(line.count("|") == 11 for line in table)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--kinds", "Q3_K"], "unknown kind"),
        (["--kernels", "bf16"], "unknown kind or kernel"),
        (["--cols", "500"], "multiple of 256"),
        (["--tokens", "9"], "at most 8"),
        (["--tokens", "0"], "positive"),
        (["--bandwidth-mb", "0"], "--bandwidth-mb at least 1"),
        (["--threads", "a"], "integers"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], needle: str) -> None:
    r = _run(*args, "--rounds", "1", python=IMPORTTIME)
    assert r.returncode == 2 and needle in r.stderr
    assert "torch" not in imported(r.stderr)  # refused at once, not after torch's import
