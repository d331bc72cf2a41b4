"""One check for every refusal a test expects: a non-zero exit, the message the user is owed, and no traceback.

`exit_code != 0` alone passes for a crash too (an uncaught exception exits 1 under click's runner and under
Python), so a refusal test that only checks the exit code cannot tell a refusal from a bug. This helper takes a
click `Result` (CliRunner) or a `subprocess.CompletedProcess` and asserts all three.
"""

from __future__ import annotations

import subprocess
from typing import Any


def assert_refused(result: Any, *needles: str) -> str:
    """Assert `result` is a refusal whose output names each of `needles`; return its output (stdout + stderr).

    For a CliRunner result the refusal must be click's own exit (SystemExit from a UsageError or ClickException),
    never another exception that the runner caught; for a subprocess, no "Traceback" may appear in its output.
    """
    assert needles, "a refusal test names the message it expects"
    if isinstance(result, subprocess.CompletedProcess):
        code, output = result.returncode, f"{result.stdout or ''}{result.stderr or ''}"
    else:
        code, output = result.exit_code, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            f"crashed with {type(result.exception).__name__}: {result.exception}\n{output}"
        )
    assert code != 0, output
    assert "Traceback" not in output, output
    for needle in needles:
        assert needle in output, f"{needle!r} not in:\n{output}"
    return output
