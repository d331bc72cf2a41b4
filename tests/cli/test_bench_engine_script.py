"""scripts/bench_engine.py runs end to end at --quick sizes on the tiny checkpoint: every measurement, or those --only
names, with its tables and its JSON; an unknown measurement is refused before torch loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.import_log import IMPORTTIME, imported
from tests.cli.run_here import run_script_in_process

REPO = Path(__file__).resolve().parents[2]
MEASUREMENTS = ("sessions", "decode", "prefill", "stall", "burst")


def _bench(model: Path, *args: str, python: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    cmd = [
        *(python or [sys.executable]),
        str(REPO / "scripts" / "bench_engine.py"),
        "--model",
        str(model),
        "--threads",
        "1",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)


def _bench_here(model: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The script in this process (tests/cli/run_here.py); the refusal test runs it as a process of its own."""
    return run_script_in_process(
        REPO / "scripts" / "bench_engine.py", ["--model", str(model), "--threads", "1", *args], capsys
    )


def test_quick_runs_every_measurement(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    stdout = _bench_here(tiny_model_dir, "--quick", "--json", str(out_json), "--markdown", str(out_md), capsys=capsys)
    data = json.loads(out_json.read_text())
    assert data["config"]["quick"] is True and set(MEASUREMENTS) <= set(data)
    assert len(data["sessions"]) == 5 and all(row["tok_s"] > 0 for row in data["sessions"])
    for row in data["prefill"]:  # A: one request per pass; B: all of them in one pass
        assert (row["a_passes"], row["b_passes"]) == (row["requests"], 1) and row["ratio"] > 0
    for row in data["stall"]:
        assert row["window_gaps"] > 0 and row["p99_ratio"] > 0 and row["long_ttft"] > 0
    assert [row["mixed_prefill_tokens"] for row in data["stall"]] == [24, 512]
    before, after = data["burst"]
    assert before["setup"].startswith("before") and after["setup"] == "after"
    assert after["cached_tokens"][0] == 0 and all(c > 0 for c in after["cached_tokens"][1:])
    assert 0 < after["hit_rate"] <= 1
    text = out_md.read_text()
    for title in ("Sessions:", "Batched decode.", "Batched prefill:", "Decode stall:", "Burst:"):
        assert title in text and title in stdout
    assert "B/A" in stdout and "p99 ratio" in stdout and "TTFT p50" in stdout


def test_only_selects_and_sizes_override_quick(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json = tmp_path / "bench.json"
    args = ("--quick", "--only", "prefill", "--prefill-lens", "32", "--json", str(out_json))
    stdout = _bench_here(tiny_model_dir, *args, capsys=capsys)
    data = json.loads(out_json.read_text())
    assert set(data) == {"config", "prefill"}
    assert [row["prompt_tokens"] for row in data["prefill"]] == [32]
    assert "Sessions:" not in stdout and "Burst:" not in stdout


def test_unknown_measurement_is_refused(tiny_model_dir: Path) -> None:
    r = _bench(tiny_model_dir, "--only", "prefill,bogus", python=IMPORTTIME)
    assert r.returncode == 2 and "bogus" in r.stderr
    assert "torch" not in imported(r.stderr)  # refused at once, not after torch's import
