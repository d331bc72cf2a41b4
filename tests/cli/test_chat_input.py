"""`radixcache chat` with its standard input or output closed (`radixcache chat <&-`, `>&-`), as a real subprocess:
one error line naming the stream, exit 1, no traceback (each was an internal AttributeError once the model loaded)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.cli.conftest import _cli_command, _subprocess_env


def test_chat_with_stdin_closed_names_it(tiny_model_dir: Path) -> None:
    done = subprocess.run(
        [*_cli_command(), "chat", "--model", str(tiny_model_dir), "--max-tokens", "2"],
        capture_output=True,
        text=True,
        env=_subprocess_env(),
        timeout=120,
        preexec_fn=lambda: os.close(0),
    )
    assert done.returncode == 1
    assert "error: standard input is closed" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert done.stdout == ""


def test_chat_with_stdout_closed_names_it(tiny_model_dir: Path) -> None:
    done = subprocess.run(
        [*_cli_command(), "chat", "--model", str(tiny_model_dir), "--max-tokens", "2"],
        input="hi\n",
        stderr=subprocess.PIPE,
        text=True,
        env=_subprocess_env(),
        timeout=120,
        preexec_fn=lambda: os.close(1),
    )
    assert done.returncode == 1
    assert "error: standard output is closed" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_chat_at_end_of_input_at_once_exits_0(run_cli, tiny_model_dir: Path) -> None:
    done = run_cli("chat", "--model", str(tiny_model_dir), "--max-tokens", "2", input="")
    assert done.returncode == 0, done.stderr
    assert "error" not in done.stderr and done.stdout == ""
