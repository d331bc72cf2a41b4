"""--cache-dir naming something that exists and is no directory (/dev/null, a pipe) is a bad option before the model
loads: it ran with the disk tier off behind one warning line and exited 0."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from radixcache.cli.main import main


@pytest.mark.parametrize("command", ["replay", "chat", "serve"])
def test_a_cache_dir_that_is_a_device_is_a_bad_option(runner, tmp_path: Path, command: str) -> None:
    missing_model = str(tmp_path / "no-model")  # the option is refused first: the model is never looked for
    result = runner.invoke(main, [command, "--model", missing_model, "--cache-dir", os.devnull])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--cache-dir': '/dev/null' exists and is not a directory" in result.output
    assert "Traceback" not in result.output


def test_a_cache_dir_that_is_a_pipe_is_a_bad_option(runner, tmp_path: Path) -> None:
    pipe = tmp_path / "fifo"
    os.mkfifo(pipe)
    result = runner.invoke(main, ["replay", "--model", str(tmp_path / "no-model"), "--cache-dir", str(pipe)])
    assert result.exit_code == 2, result.output
    assert f"'{pipe}' exists and is not a directory" in result.output


def test_a_new_cache_dir_is_still_taken(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    kv = tmp_path / "kv"
    args = ["replay", "--model", str(tiny_model_dir), "--limit", "1", "--max-tokens", "1", "--cache-dir", str(kv)]
    done = runner.invoke(main, args)
    assert done.exit_code == 0, done.output
    assert (kv / "radixcache-cache.json").exists()
