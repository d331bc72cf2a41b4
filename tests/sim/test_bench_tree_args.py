"""scripts/bench_tree.py refuses, by name and before any replay, the arguments it cannot run with."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.refusals import assert_refused
from tests.sim.conftest import SCRIPTS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--conversations", "0"], "argument --conversations: expected an int >= 1"),  # ZeroDivisionError
        (["--repeats", "0"], "argument --repeats: expected an int >= 1"),  # IndexError, after the runs
        (["--page-size", "0"], "argument --page-size: expected an int >= 1"),  # ZeroDivisionError
        (["--capacity-tokens", "0"], "argument --capacity-tokens: expected an int >= 1"),
        # a CacheFullError traceback mid-replay: the longest of 3 conversations' requests is 2,563 tokens
        (["--capacity-tokens", "100"], "--capacity-tokens 100 cannot hold the workload's longest request"),
        (["--capacity-tokens", "2562"], "give at least 2563"),
        (["--capacity-tokens", "2563", "--page-size", "16"], "give at least 2576"),
    ],
)
def test_an_argument_it_cannot_run_with_is_refused_by_name(args: list[str], message: str) -> None:
    cmd = [sys.executable, str(SCRIPTS / "bench_tree.py"), "--no-sglang", "--conversations", "3", "--repeats", "1"]
    result = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)
    assert_refused(result, message)


def test_the_smallest_capacity_it_takes_runs() -> None:
    cmd = [sys.executable, str(SCRIPTS / "bench_tree.py"), "--no-sglang", "--conversations", "3", "--repeats", "1"]
    result = subprocess.run([*cmd, "--capacity-tokens", "2563", "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
