"""`python -m radixcache.cli.main` is the `radixcache` command, as a real subprocess: it ran nothing and exited 0."""

from __future__ import annotations

import subprocess
import sys

from tests.cli.conftest import _subprocess_env


def _module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "radixcache.cli.main", *args],
        capture_output=True,
        text=True,
        env=_subprocess_env(),
        timeout=120,
    )


def test_the_module_runs_the_command_and_its_help() -> None:
    done = _module("--help")
    assert done.returncode == 0
    assert "replay" in done.stdout and "simulate" in done.stdout


def test_the_module_reports_a_bad_option_with_its_exit_status() -> None:
    done = _module("replay", "--limit", "0")
    assert done.returncode == 2
    assert "error: Invalid value for '--limit'" in done.stderr
    assert "Traceback" not in done.stderr
