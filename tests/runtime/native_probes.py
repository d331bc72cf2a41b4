"""A fork server for the native kernels' load probes (tests/runtime/conftest.py `native_probes`: test_native_build,
test_native_cut_build).

Each probe must run in a process of its own: the loader (`runtime.native.blockdot`) is memoised per process, and
the crash a cut build caused (SIGBUS in dlopen) would take the test run with it. A fresh interpreter per probe
imported torch each time (about 2 s of CPU; these tests ran eleven). The server imports `runtime.native` (torch
first, as the loader does) once and never loads the kernels itself; each probe is a child forked from it with the
probe's whole environment, its code run with standard output and error in files, and its exit status (negative:
the signal that ended it) as the answer. The child starts with an empty memo, and a crash takes only the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[2]

SERVER = """
import json, os, sys, traceback
import radixcache.runtime.native  # torch, then the loader: once, here (nothing is loaded)
for line in sys.stdin:
    code, env, out, err = json.loads(line)
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            os.environ.clear()
            os.environ.update(env)
            os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
            os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
            exec(compile(code, "<probe>", "exec"), {"__name__": "__main__"})
        except BaseException:
            traceback.print_exc()
            status = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    print(json.dumps(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)), flush=True)
"""


def probe_environment(cache: Path, **env: str) -> dict[str, str]:
    """This process's environment with `cache` as the native cache folder, the repository on the path, one OpenMP
    thread, and `env` on top."""
    full = {k: v for k, v in os.environ.items() if k != "RADIXCACHE_NATIVE_CACHE"}
    paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    full.update({"RADIXCACHE_NATIVE_CACHE": str(cache), "PYTHONPATH": os.pathsep.join(paths), "OMP_NUM_THREADS": "1"})
    return {**full, **env}


class ProbeResult(NamedTuple):
    """A probe's exit status (negative: the signal that ended it), standard output and standard error."""

    returncode: int
    stdout: str
    stderr: str


class ProbeServer:
    """The fork server (the module docstring); its files go in `folder`. Close it when done."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        env = probe_environment(folder / "unused-cache")
        cmd = [sys.executable, "-c", SERVER]
        self._proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, code: str, env: dict[str, str]) -> ProbeResult:
        """Run `code` in a child forked from the server, with `env` as its whole environment."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        fd, out = tempfile.mkstemp(dir=self._folder, suffix=".out")
        os.close(fd)
        err = out[: -len(".out")] + ".err"
        self._proc.stdin.write(json.dumps([code, env, out, err]) + "\n")
        self._proc.stdin.flush()
        answer = self._proc.stdout.readline()
        assert answer, f"the probe server ended ({self._proc.poll()})"
        return ProbeResult(int(json.loads(answer)), Path(out).read_text(), Path(err).read_text())

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(30)
