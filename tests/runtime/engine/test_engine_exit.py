"""An engine still generating when the interpreter exits: its loop thread (a daemon) was left inside torch as the
interpreter finalised, which once aborted a process ("terminate called without an active exception", SIGABRT,
after scripts/bench_engine.py printed its tables). Engines still open, and loops whose engine was dropped, are
stopped at exit (engine.exit_hook): their threads have left before the interpreter finalises."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.testing import hold_engine_loop, tiny_model

SCRIPT = """
import atexit, threading, time

def report():  # registered before any engine: runs after the engines' own exit hook
    alive = [t for t in threading.enumerate() if t.name == "radixcache-engine"]
    print("loop threads at exit:", len(alive), flush=True)
    for how, req in reqs.items():
        print(how, "tokens:", len(req.output_ids), req.finish_reason, flush=True)

atexit.register(report)

from radixcache.runtime import Engine
from radixcache.runtime.testing import tiny_model

model = tiny_model(seed=1, max_position=40_000)
engines = {how: Engine(model, capacity_blocks=2600, page_size=16, threads=1) for how in ("open", "dropped")}
handles = {how: e.submit([1, 2, 3, 4, 5], 30_000, ignore_eos=True) for how, e in engines.items()}
reqs = {how: h.request for how, h in handles.items()}
while not all(r.output_ids for r in reqs.values()):  # both generating now
    time.sleep(0.01)
del engines["dropped"], handles["dropped"]  # its loop thread keeps running the request
print("exiting", flush=True)
"""


def test_engines_generating_at_interpreter_exit_are_stopped_before_the_interpreter_finalises(tmp_path: Path) -> None:
    """One engine still open and one whose engine object was dropped (its loop thread still running the request),
    both generating, in one interpreter: each hook alone leaves the other's loop thread alive at exit."""
    script = tmp_path / "exit_while_generating.py"
    script.write_text(textwrap.dedent(SCRIPT))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    assert lines[-3] == "loop threads at exit: 0", run.stdout + run.stderr[-2000:]
    for how, line in zip(("open", "dropped"), lines[-2:], strict=True):
        assert line.startswith(f"{how} tokens: ") and line.endswith(" cancelled"), line  # cancelled mid-generation


FORK_SCRIPT = """
import os, signal, sys, time

from radixcache.runtime import Engine
from radixcache.runtime.testing import tiny_model

engine = Engine(tiny_model(seed=1, max_position=40_000), capacity_blocks=2600, page_size=16, threads=1)
handle = engine.submit([1, 2, 3, 4, 5], 30_000, ignore_eos=True)
while not handle.request.output_ids:  # generating now
    time.sleep(0.01)
pid = os.fork()
if pid == 0:
    sys.exit(0)  # the child exits normally: its atexit hooks run
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print("child exited", os.waitstatus_to_exitcode(status), flush=True)
        break
    time.sleep(0.05)
else:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print("child hung", flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_exits_without_closing_the_engines_it_inherited(tmp_path: Path) -> None:
    """The child of os.fork inherits its parent's engines but none of their loop threads: closing them at its exit
    waited for a thread that its state said ran, for ever (a spinning child)."""
    script = tmp_path / "fork_while_generating.py"
    script.write_text(textwrap.dedent(FORK_SCRIPT))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "child exited 0", run.stdout + run.stderr[-2000:]


class RecordingTiers:
    """Stands in for an engine's tiers at close: records the bound its disk writes were given."""

    def __init__(self) -> None:
        self.bounds: list[float | None] = []

    def close(self, timeout: float | None = 30.0) -> None:
        self.bounds.append(timeout)


def test_close_bounds_the_loop_and_the_disk_writes_together_by_its_timeout() -> None:
    """close(timeout) waited `timeout` for the loop, then `timeout` again for the disk writes: an exit's close at
    EXIT_WAIT_S could take twice that. The disk writes get what the loop's wait left."""
    engine = Engine(tiny_model(seed=1), capacity_blocks=16, page_size=4, threads=1)
    engine.tiers = RecordingTiers()  # type: ignore[assignment]
    release = hold_engine_loop(engine)
    closing = threading.Thread(target=engine.close, args=(5.0,))
    closing.start()
    while not engine._closed:  # its bound starts before this is set
        time.sleep(0.001)
    time.sleep(0.3)  # the loop is held 0.3 s at least after close began
    release()
    closing.join(60)
    assert len(engine.tiers.bounds) == 1 and engine.tiers.bounds[0] <= 4.7
