"""Where `radixcache replay` writes: `--json -` (or the file stdout is) puts the JSON alone on stdout, for a pipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixcache.cli.main import main


def test_json_dash_prints_the_json_alone_on_stdout_and_the_table_on_stderr(
    runner, tiny_model_dir: Path, small_trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--json -` wrote a file named '-' (click's convention, and jq's users', is stdout)."""
    monkeypatch.chdir(tmp_path)
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--max-tokens", "2", "--json", "-"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["summary"]["requests"] == 4  # the JSON, whole and alone
    assert "prompt tokens" in result.stderr and "wrote -" not in result.stderr
    assert not (tmp_path / "-").exists()


def test_json_to_dev_stdout_in_a_pipe_is_the_json_alone(tiny_model_dir: Path, small_trace: Path) -> None:
    """`replay --json /dev/stdout | jq`: the table followed the JSON on stdout, and jq read 'Extra data'."""
    code = "from radixcache.cli.main import run; run()"
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--max-tokens", "2", "--json", "/dev/stdout"]
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["summary"]["requests"] == 4
    assert "prompt tokens" in done.stderr
