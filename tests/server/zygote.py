"""`radixcache serve` processes forked from one that imported torch and radixcache already (the zygote), for the
server tests. A fresh server process spends about 2.9 s of CPU (2.5 s of wall time on an idle core) importing torch
and radixcache before it reads its options, and the server tests start about thirty. A fork of the zygote runs the
same `radixcache.cli.main.run()` on the same arguments, in the same environment and folder, from the interpreter
state those imports reach in a fresh process, so what a test observes is what it saw of a `subprocess.Popen`: a
process of its own pid that takes signals, writes stdout and stderr to one pipe and ends with its own exit status
(`ForkedProcess` is the part of Popen's interface the tests use).

The zygote imports what a server imports, in the order a server does (runtime's environment defaults before torch
loads its OpenMP), and starts nothing (no thread, no OpenMP team: a fork must not copy them); it reaps
its children and reports each one's exit status over a SOCK_SEQPACKET socket, which also passes each child's
output pipe (SCM_RIGHTS). It ends when its parent closes that socket (the session's end) or dies.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping

CODE = r"""
import json, os, select, socket, sys, traceback
# The imports a server process spends its first seconds on, in its order: radixcache.runtime sets libgomp's
# OMP_WAIT_POLICY and GOMP_SPINCOUNT defaults before torch loads libgomp, which reads them then.
from radixcache.cli.main import run
import radixcache.runtime
import torch
import radixcache.runtime.server

ctl = socket.socket(fileno=int(sys.argv[1]))


def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ctl.send(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


ctl.send(b'{"ready": true}')
while True:
    readable, _, _ = select.select([ctl], [], [], 0.05)
    reap()
    if not readable:
        continue
    msg, fds, _, _ = socket.recv_fds(ctl, 1 << 20, 1)
    if not msg:
        break
    request = json.loads(msg)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            ctl.close()
            os.dup2(fds[0], 1)
            os.dup2(fds[0], 2)
            os.close(fds[0])
            os.chdir(request["cwd"])
            for key, value in request["env"].items():  # the variables of the server's environment that differ
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            sys.argv = ["-c", *request["args"]]
            exec(request["prelude"], {"__name__": "__main__"})
            run()  # ends the process itself (cli.exit.exit_now)
            status = 0
        except SystemExit as done:
            status = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(status)
    os.close(fds[0])
    ctl.send(json.dumps({"pid": pid}).encode())
"""


class Zygote:
    """The zygote process for `env` (the environment every server it forks runs in) and its socket."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CODE, str(theirs.fileno())],
            env=self.env,
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()  # one launch at a time
        self.cond = threading.Condition()
        self.pids: list[int] = []
        self.exits: dict[int, int] = {}
        if json.loads(self.sock.recv(1 << 16) or b"{}").get("ready") is not True:
            raise RuntimeError(f"the zygote did not start (exit status {self.proc.wait()})")
        self.reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while msg := self.sock.recv(1 << 16):
            event = json.loads(msg)
            with self.cond:
                if "pid" in event:
                    self.exits.pop(event["pid"], None)  # an earlier child's pid, reused
                    self.pids.append(event["pid"])
                else:
                    self.exits[event["exit"]] = event["code"]
                self.cond.notify_all()
        with self.cond:
            self.pids.append(0)  # the zygote is gone
            self.cond.notify_all()

    def can_run_in(self, env: Mapping[str, str]) -> bool:
        """Whether a fork runs as a process started in `env` would: only variables that nothing reads at import
        (pytest's PYTEST_CURRENT_TEST) differ from the zygote's."""
        return set(self._diff(env)) <= {"PYTEST_CURRENT_TEST"}

    def _diff(self, env: Mapping[str, str]) -> dict[str, str | None]:
        keys = set(env) | set(self.env)
        return {k: env.get(k) for k in keys if env.get(k) != self.env.get(k)}

    def spawn(self, args: list[str], env: Mapping[str, str], prelude: str = "") -> ForkedProcess:
        """A server process running `radixcache <args>` after `prelude` in `env` (see can_run_in); its stdout and
        stderr: one text pipe."""
        read_end, write_end = os.pipe()
        request = {"args": args, "env": self._diff(env), "prelude": prelude, "cwd": os.getcwd()}
        with self.lock:
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], [write_end])
            finally:
                os.close(write_end)
            with self.cond:
                self.cond.wait_for(lambda: self.pids, timeout=60)
                pid = self.pids.pop(0) if self.pids else 0
        if not pid:
            os.close(read_end)
            raise RuntimeError("the zygote did not fork a server")
        return ForkedProcess(self, pid, open(read_end))  # text, as Popen's text=True

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # the zygote's loop ends at the end of its socket (and the reader's)
        self.reader.join(timeout=10)
        self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


class ForkedProcess:
    """A forked server as the tests use a `subprocess.Popen`: pid, poll, wait, send_signal, kill, returncode, stdout."""

    def __init__(self, zygote: Zygote, pid: int, stdout: io.TextIOWrapper) -> None:
        self.zygote, self.pid, self.stdout = zygote, pid, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with self.zygote.cond:
            self.returncode = self.zygote.exits.get(self.pid, self.returncode)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.zygote.cond:
            if not self.zygote.cond.wait_for(lambda: self.pid in self.zygote.exits, timeout=timeout):
                raise subprocess.TimeoutExpired(f"server pid {self.pid}", timeout or 0)
            self.returncode = self.zygote.exits[self.pid]
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
