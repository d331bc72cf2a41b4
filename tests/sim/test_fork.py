"""A replay forked beside the simulator's own (radixcache.sim.fork) ends with the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the replays are forked on Linux")

PARENT = """
import time
from radixcache.sim.fork import ForkedCall
call = ForkedCall(lambda: time.sleep(120))  # a Belady replay nobody will wait for
print(call.process.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    """Running: its /proc entry is there and not a zombie's (an orphan's zombie may wait a while to be reaped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_a_forked_replay_dies_with_a_parent_killed_by_a_signal() -> None:
    """`timeout 60 radixcache simulate BIG --belady` (SIGTERM) skipped multiprocessing's exit, which stops daemonic
    children: the Belady replays ran on to their end, then printed two BrokenPipeError tracebacks."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=30)
        for _ in range(400):  # at most 20 s; the kernel kills it as the parent dies
            if not _alive(child):
                break
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
        parent.stdout.close()
