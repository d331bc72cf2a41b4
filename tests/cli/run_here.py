"""A repository script run as `__main__` in the test's own process: what `python scripts/NAME.py ARGS` runs, without a
second interpreter importing torch (about 2.5 s of CPU). For tests of what a script computes and prints, not of its
process (its exit codes, signals and refusals before torch loads run it as a process of its own)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch


def run_script_in_process(script: Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `script` with `args` as its argv; a non-zero exit fails the test with its stderr. Its standard output is
    returned; torch's thread count, sys.argv and sys.path, which scripts set, are restored."""
    threads, argv, path = torch.get_num_threads(), sys.argv, sys.path[:]
    sys.argv = [str(script), *args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        assert stop.code in (0, None), capsys.readouterr().err[-3000:]
    finally:
        torch.set_num_threads(threads)
        sys.argv, sys.path[:] = argv, path
    return capsys.readouterr().out
