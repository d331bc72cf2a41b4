"""cli/exit.py and the console script's `run`: a `radixcache` process ends with its command's status after what
Python's own exit does first (threads' exit callbacks and joins, atexit handlers, flushed stdio), in real processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from radixcache.cli.exit import exit_status
from tests.cli.conftest import _cli_command, _subprocess_env


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env=_subprocess_env(),
        check=False,
    )


def test_the_status_of_each_kind_of_system_exit() -> None:
    assert exit_status(None) == 0 and exit_status(0) == 0 and exit_status(2) == 2 and exit_status(256 + 3) == 3


def test_threads_atexit_handlers_and_buffered_output_all_finish_before_the_exit() -> None:
    done = _python(
        """
        import atexit, sys, threading, time
        from concurrent.futures import ThreadPoolExecutor
        from radixcache.cli.exit import exit_now

        atexit.register(lambda: print("atexit handler ran"))
        worker = threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished")))
        worker.start()
        pool = ThreadPoolExecutor(2)  # never shut down: threading's exit callback stops its workers
        pool.submit(time.sleep, 0.1)
        sys.stdout.write("no newline, still buffered")
        sys.stderr.write("to stderr")
        exit_now(3)
        """
    )
    assert done.returncode == 3, done.stderr
    assert "thread finished" in done.stdout and "atexit handler ran" in done.stdout
    assert "no newline, still buffered" in done.stdout and done.stderr == "to stderr"


def test_a_message_exit_prints_it_and_gives_1() -> None:
    done = _python("from radixcache.cli.exit import exit_now, exit_status; exit_now(exit_status('bad trace'))")
    assert (done.returncode, done.stderr.strip()) == (1, "bad trace")


def test_the_console_script_keeps_each_commands_status_and_output() -> None:
    ok = subprocess.run([*_cli_command(), "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert ok.returncode == 0 and "radixcache" in ok.stdout
    usage = subprocess.run(
        [*_cli_command(), "simulate", "--bogus"], capture_output=True, text=True, timeout=60, check=False
    )
    assert usage.returncode == 2 and "No such option '--bogus'" in usage.stderr
