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

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.testing import hold_engine_loop, tiny_model

SCRIPT = """
import atexit, os, signal, sys, threading, time

PARENT = os.getpid()

def report():  # registered before any engine: runs after the engines' own exit hook
    if os.getpid() != PARENT:  # the forked child's exit
        return
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
if hasattr(os, "fork"):
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
del engines["dropped"], handles["dropped"]  # its loop thread keeps running the request
print("exiting", flush=True)
"""


# Both tests read the one run: under xdist one worker takes them, so the interpreter runs once.
EXIT_RUN = pytest.mark.xdist_group("engine_exit_run")


@pytest.fixture(scope="module")
def exit_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """One interpreter for the exit cases below (a torch import and an engine start each, otherwise): two engines
    generating, one still open and one whose engine object is dropped; a child forked meanwhile exits; then the
    interpreter exits."""
    folder = tmp_path_factory.mktemp("exit_while_generating")
    script = folder / "exit_while_generating.py"
    script.write_text(textwrap.dedent(SCRIPT))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=folder)


@EXIT_RUN
def test_engines_generating_at_interpreter_exit_are_stopped_before_the_interpreter_finalises(
    exit_run: subprocess.CompletedProcess[str],
) -> None:
    """One engine still open and one whose engine object was dropped (its loop thread still running the request),
    both generating, in one interpreter: each hook alone leaves the other's loop thread alive at exit."""
    assert exit_run.returncode == 0, exit_run.stderr[-2000:]
    lines = exit_run.stdout.strip().splitlines()
    assert lines[-3] == "loop threads at exit: 0", exit_run.stdout + exit_run.stderr[-2000:]
    for how, line in zip(("open", "dropped"), lines[-2:], strict=True):
        assert line.startswith(f"{how} tokens: ") and line.endswith(" cancelled"), line  # cancelled mid-generation


@EXIT_RUN
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_exits_without_closing_the_engines_it_inherited(
    exit_run: subprocess.CompletedProcess[str],
) -> None:
    """The child of os.fork inherits its parent's engines but none of their loop threads: closing them at its exit
    waited for a thread that its state said ran, for ever (a spinning child)."""
    assert exit_run.returncode == 0, exit_run.stderr[-2000:]
    assert "child exited 0" in exit_run.stdout.strip().splitlines(), exit_run.stdout + exit_run.stderr[-2000:]


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
