"""runtime/native/team_pool.c, the decode team's helper threads, through a C harness (team_pool_stress.c) that runs
takeover.h's phases on the pool from several caller threads at once, each step on a random team of 1 to 8 seats
(more threads than the machine's cores), helpers losing their core at random before, inside and after their claims:
every step's units are whole when its call returns, no helper stores outside the slot once its step's call returned,
memory a step read and freed after native_team_quiesce is never read again (an address sanitizer build, where the
compiler has one), a forked child runs steps on a pool of its own, and nothing hangs."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent
NATIVE = HERE.parents[2] / "runtime" / "native"
COMPILER = shlex.split(os.environ.get("CC", "")) or ["cc"]

pytestmark = pytest.mark.skipif(shutil.which(COMPILER[0]) is None, reason="the harness needs a C compiler")


def _build(out: Path, sanitize: bool) -> Path | None:
    """The harness at `out`, or None where it does not compile (or link) so."""
    flags = ["-fsanitize=address", "-fno-omit-frame-pointer"] if sanitize else []
    cmd = [*COMPILER, "-O1", "-g", "-std=gnu11", "-pthread", f"-I{NATIVE}", str(HERE / "team_pool_stress.c")]
    built = subprocess.run([*cmd, *flags, "-o", str(out)], capture_output=True, check=False)
    return out if built.returncode == 0 else None


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The harness plain and, where the compiler links it, with the address sanitizer (not for the forks: the
    sanitizer's own allocator may be left locked in a child by another thread's malloc)."""
    folder = tmp_path_factory.mktemp("team_pool")
    plain = _build(folder / "plain", sanitize=False)
    assert plain is not None, "the harness does not compile"
    return {"": _build(folder / "asan", sanitize=True) or plain, "fork": plain}


@pytest.mark.parametrize("mode", ["", "fork"])
def test_steps_from_several_threads_on_teams_past_the_cores_stay_whole_and_fenced(
    harnesses: dict[str, Path], mode: str
) -> None:
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0"}
    env.pop("LD_PRELOAD", None)
    cmd = [str(harnesses[mode]), "3", "300", *([mode] if mode else [])]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    assert "AddressSanitizer" not in run.stderr, run.stderr[-4000:]
    assert run.returncode == 0, (run.stdout, run.stderr[-4000:])
    forks = 10 if mode == "fork" else 0
    assert run.stdout.split() == ["callers", "3", "steps", "300", "forks", str(forks), "violations", "0"]


def test_a_fork_while_the_first_step_holds_the_pool_leaves_the_child_a_free_pool(tmp_path: Path) -> None:
    out = tmp_path / "fork"
    cmd = [*COMPILER, "-O1", "-std=gnu11", "-pthread", f"-I{NATIVE}", str(HERE / "team_pool_fork.c"), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    run = subprocess.run([str(out)], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "child ok", (run.stdout, run.stderr)
