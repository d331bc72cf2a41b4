"""`--record-trace FILE` keeps an earlier FILE until the first line is recorded, on `serve` as on `replay`
(cli.record.StagedRecording), and a run's start removes the staging files (`.FILE.<pid>.partial`) that killed runs
left, never one a live process holds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from radixcache.cli import serve as serve_module
from radixcache.cli.main import main
from radixcache.cli.record import StagedRecording
from radixcache.runtime.atomic_file import remove_stale_partials

EARLIER = '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n'
NO_PID = 4_194_399  # past Linux's largest pid_max (2**22): no process has it


def _serving(monkeypatch: pytest.MonkeyPatch, requests: int, seen: dict[str, Any]) -> None:
    """Replace uvicorn's server by one that, in place of clients, sends `requests` requests to the app's engine and
    notes what FILE held before the first and after the last."""

    class Server:
        def __init__(self, config: Any, *_: object) -> None:
            self.engine = config.app.state.engine

        def run(self, sockets: Any = None) -> None:
            seen["before"] = seen["path"].read_text()
            for i in range(requests):
                self.engine.generate(f"hello {i}", 2)
            seen["after"] = seen["path"].read_text()

    monkeypatch.setattr(serve_module, "_aborting_server", Server)


@pytest.mark.parametrize("requests", [0, 2])
def test_serve_keeps_an_earlier_recording_until_its_first_line(
    runner, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requests: int
) -> None:
    """`serve --record-trace FILE` opened FILE for writing at start: an earlier recording there was emptied before
    any request came, and lost for good by a server that served none (a wrong flag, a client that never came). FILE
    is now replaced at the first line; a server that served nothing leaves it as it was, and says so."""
    path = tmp_path / "served.jsonl"
    path.write_text(EARLIER)
    seen: dict[str, Any] = {"path": path}
    _serving(monkeypatch, requests, seen)
    args = ["serve", "--model", str(tiny_model_dir), "--port", "0", "--record-trace", str(path)]
    result = runner.invoke(main, [*args, "--page-size", "4"])
    assert result.exit_code == 0, result.output
    assert seen["before"] == EARLIER  # the server was up, and no request had come
    if requests:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(rows) == requests and seen["after"] == path.read_text()  # each line as its request left
        assert f"recorded {path}: {requests} requests" in result.stderr
    else:
        assert path.read_text() == EARLIER
        assert f"recorded nothing (no request was served): {path} left as it was" in result.stderr
        assert "radixcache simulate" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["served.jsonl"]  # no staging file left beside it


def test_a_start_removes_the_partials_of_dead_runs_only(tmp_path: Path) -> None:
    """A run killed (kill -9) before its first line left `.FILE.<pid>.partial`, for good. The next start removes
    such files whose pid runs no more; it keeps one whose pid runs (a live run's, or a reused pid's), one locked by
    a process (a run on another machine that shares the folder), its own pid's (reused by a container's restart: it
    becomes this run's own) and other files' partials."""
    import fcntl

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # exited: no process has it (unless reused since: then kept, as it should be)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            "dead": f".t.jsonl.{NO_PID}.partial",
            "exited": f".t.jsonl.{dead_pid}.partial",
            "live": f".t.jsonl.{live.pid}.partial",
            "locked": f".t.jsonl.{NO_PID + 1}.partial",
            "other file": f".u.jsonl.{NO_PID}.partial",
            "not a pid": ".t.jsonl.x1.partial",
            "nested name": f".t.jsonl.5.{NO_PID}.partial",  # FILE t.jsonl.5's
        }
        for name in names.values():
            (tmp_path / name).write_text('{"timestamp": 0}\n')
        held = os.open(tmp_path / names["locked"], os.O_RDONLY)
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            removed = remove_stale_partials(str(tmp_path), "t.jsonl")
        finally:
            os.close(held)
    finally:
        live.kill()
        live.wait()
    gone = {str(tmp_path / names["dead"])}
    if dead_pid != live.pid and not _runs(dead_pid):
        gone.add(str(tmp_path / names["exited"]))
    assert set(removed) == gone
    assert {p.name for p in tmp_path.iterdir()} == set(names.values()) - {Path(p).name for p in gone}


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def test_a_staging_file_is_locked_while_its_run_lasts(tmp_path: Path) -> None:
    """Another start, one whose pid check cannot see this process (another machine), keeps a live run's staging
    file: it is locked from its making to `finish`; then it is gone (placed or removed)."""
    path = tmp_path / "t.jsonl"
    staged = StagedRecording(str(path))
    foreign = tmp_path / f".t.jsonl.{NO_PID}.partial"  # the live file, as a start elsewhere would see it
    os.link(staged.staging, foreign)
    assert remove_stale_partials(str(tmp_path), "t.jsonl") == [] and foreign.exists()
    assert staged.finish() is False and not Path(staged.staging).exists()
    assert remove_stale_partials(str(tmp_path), "t.jsonl") == [str(foreign)]  # the lock went with finish


def test_a_replay_removes_a_partial_that_a_killed_replay_left(runner, tiny_model_dir: Path, tmp_path: Path) -> None:
    recorded = tmp_path / "r.jsonl"
    recorded.write_text(EARLIER)
    (tmp_path / f".r.jsonl.{NO_PID}.partial").write_text("")  # killed before its first line
    args = ["replay", "--model", str(tiny_model_dir), "--limit", "1", "--max-tokens", "2"]
    result = runner.invoke(main, [*args, "--record-trace", str(recorded)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"] and recorded.read_text() != EARLIER


class _FullAfter:
    """A recording's file on a disk that fills after `lines` lines: each later write fails with ENOSPC."""

    def __init__(self, file: Any, lines: int) -> None:
        self.file, self.left = file, lines

    def write(self, data: Any) -> int:
        if self.left == 0:
            raise OSError(28, "No space left on device")
        self.left -= 1
        return self.file.write(data)

    def close(self) -> None:
        self.file.close()


def _disk_fills_after(monkeypatch: pytest.MonkeyPatch, lines: int) -> None:
    from radixcache.runtime.engine.trace_recorder import TraceRecorder

    real = TraceRecorder.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real(self, *args, **kwargs)
        self._file = _FullAfter(self._file, lines)

    monkeypatch.setattr(TraceRecorder, "__init__", init)


def test_a_replay_whose_recording_stopped_says_so_and_offers_no_command(
    runner, tiny_model_dir: Path, small_trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that filled during the replay stopped the recording (one logged warning), yet the replay printed
    'recorded FILE' and the `radixcache simulate` command as reproducing its hit rate, from a file holding part of
    the run, and exited 0. It says what FILE holds, offers no command, and exits 1 (after the table)."""
    _disk_fills_after(monkeypatch, 2)
    recorded = tmp_path / "r.jsonl"
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--max-tokens", "2"]
    result = runner.invoke(main, [*args, "--record-trace", str(recorded)])
    assert result.exit_code == 1, result.output
    assert "requests" in result.stdout and len(recorded.read_text().splitlines()) == 2  # of the run's 4
    message = f"error: the recording stopped (No space left on device): {recorded} holds its first 2 requests"
    assert message in result.stderr, result.stderr
    assert f"recorded {recorded}" not in result.stderr and "radixcache simulate" not in result.stderr


@pytest.mark.parametrize("lines", [0, 1])
def test_a_server_whose_recording_stopped_says_so_and_offers_no_command(
    runner, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: int
) -> None:
    path = tmp_path / "served.jsonl"
    path.write_text(EARLIER)
    _disk_fills_after(monkeypatch, lines)
    _serving(monkeypatch, 3, {"path": path})
    args = ["serve", "--model", str(tiny_model_dir), "--port", "0", "--record-trace", str(path)]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output  # serving never fails for the recording
    held = "is left as it was" if lines == 0 else "holds its first 1 request"
    assert f"the recording stopped (No space left on device): {path} {held}" in result.stderr, result.stderr
    assert path.read_text() == EARLIER if lines == 0 else len(path.read_text().splitlines()) == 1
    assert "radixcache simulate" not in result.stderr and f"recorded {path}" not in result.stderr


def test_no_pid_is_signalled_on_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.kill(pid, 0) terminates the process on Windows: there no pid is asked, and every partial stays."""
    partial = tmp_path / f".t.jsonl.{NO_PID}.partial"
    partial.write_text("")
    signalled: list[tuple] = []
    with monkeypatch.context() as patch:
        patch.setattr(os, "name", "nt")
        patch.setattr(os, "kill", lambda *args: signalled.append(args))
        removed = remove_stale_partials(str(tmp_path), "t.jsonl")
    assert signalled == [] and removed == [] and partial.exists()


def test_a_file_name_too_long_for_a_staging_name_is_recorded_directly(tmp_path: Path) -> None:
    """A FILE whose name fits the file system but `.FILE.<pid>.partial` does not (a 245-byte name): the run failed
    after the model's load with ENAMETOOLONG, naming a hidden file the user never gave. It is written directly (an
    earlier FILE is not kept then), as before the staging."""
    path = tmp_path / ("r" * 239 + ".jsonl")
    staged = StagedRecording(str(path))
    assert staged.staging == str(path) and staged.placed
    with open(staged.staging, "w") as recording:  # what the recorder does
        recording.write('{"timestamp": 0}\n')
    assert staged.finish() is True and path.read_text() == '{"timestamp": 0}\n'
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_the_simulate_command_of_a_file_named_like_an_option_reads_it_as_a_file(
    runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--record-trace=-rec.jsonl` printed `radixcache simulate -rec.jsonl ...`, which failed 'No such option: -r'."""
    from radixcache.cli.record import EngineShape, simulate_command

    line = {"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1], "block_size": 4}
    (tmp_path / "-rec.jsonl").write_text(json.dumps(line) + "\n")
    monkeypatch.chdir(tmp_path)
    command = simulate_command("-rec.jsonl", EngineShape(8, "lru", 4))
    result = runner.invoke(main, [*command.split()[1:], "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["requests"] == 1


def test_a_recording_the_folder_will_not_move_onto_file_is_kept_beside_it(
    runner, tiny_model_dir: Path, small_trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A move onto FILE that the folder refuses (FILE another user's in a sticky folder such as /tmp: EPERM) raised
    out of the replay's first result and ended the run, its table, JSON and recording lost. The run goes on; FILE
    stays as it was, the recording stays in its staging file, and the replay says where (exit 1, after the table)."""
    from radixcache.cli import record

    recorded, moved = tmp_path / "r.jsonl", os.replace

    def refuse(src: str, dst: str) -> None:  # the recording's move only: --json's file is replaced as well
        if os.fspath(dst) == str(recorded):
            raise PermissionError(1, "Operation not permitted")
        moved(src, dst)

    monkeypatch.setattr(record.os, "replace", refuse)
    recorded.write_text(EARLIER)
    args = ["replay", str(small_trace), "--model", str(tiny_model_dir), "--max-tokens", "2"]
    result = runner.invoke(main, [*args, "--record-trace", str(recorded), "--json", str(tmp_path / "o.json")])
    assert result.exit_code == 1, result.output
    assert re.search(r"requests\s+│\s+4\s+│", result.stdout) and (tmp_path / "o.json").exists()
    staging = tmp_path / f".r.jsonl.{os.getpid()}.partial"
    message = f"cannot move the recording onto {recorded} (Operation not permitted): it is in {staging}"
    assert message in result.stderr, result.stderr
    assert recorded.read_text() == EARLIER and len(staging.read_text().splitlines()) == 4


def test_a_server_whose_recording_the_folder_will_not_move_keeps_it_beside_file(
    runner, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixcache.cli import record

    def refuse(src: str, dst: str) -> None:
        raise PermissionError(1, "Operation not permitted")

    path = tmp_path / "served.jsonl"
    path.write_text(EARLIER)
    _serving(monkeypatch, 2, {"path": path})
    monkeypatch.setattr(record.os, "replace", refuse)
    result = runner.invoke(main, ["serve", "--model", str(tiny_model_dir), "--port", "0", "--record-trace", str(path)])
    assert result.exit_code == 0, result.output
    staging = tmp_path / f".served.jsonl.{os.getpid()}.partial"
    assert f"cannot move the recording onto {path} (Operation not permitted): it is in {staging}" in result.stderr
    assert path.read_text() == EARLIER and len(staging.read_text().splitlines()) == 2  # every request, still recorded


@pytest.mark.skipif(os.name == "nt", reason="POSIX file modes and folder fsyncs")
def test_a_recording_is_synced_when_placed_and_when_finished_and_keeps_files_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first line's move onto FILE was an unsynced rename: a power cut after it could leave FILE empty, the
    earlier recording gone. The recording's last lines were never synced either, and an earlier 0600 FILE came back
    0644. Now the staging file is fsynced before the move (FILE still the earlier recording), the folder after it,
    the whole recording at `finish`, and FILE keeps its mode."""
    path = tmp_path / "r.jsonl"
    path.write_text(EARLIER)
    path.chmod(0o600)
    real_fsync = os.fsync
    synced: list[tuple[int, str]] = []  # (the descriptor's inode, what FILE held then)

    def watching(fd: int) -> None:
        synced.append((os.fstat(fd).st_ino, path.read_text()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", watching)
    staged = StagedRecording(str(path))
    with open(staged.staging, "wb", buffering=0) as recording:  # what the recorder does
        recording.write(b'{"timestamp": 1}\n')
        staged.place()
        recording.write(b'{"timestamp": 2}\n')
    assert staged.finish() is True
    lines = '{"timestamp": 1}\n{"timestamp": 2}\n'
    assert path.read_text() == lines and (path.stat().st_mode & 0o777) == 0o600
    new, folder = path.stat().st_ino, tmp_path.stat().st_ino
    assert synced == [(new, EARLIER), (folder, '{"timestamp": 1}\n'), (new, lines)]
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]


def test_a_recording_moved_onto_file_whose_folder_sync_fails_counts_as_placed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The folder's fsync after the move failing (EIO) must not report the recording as left in its staging file,
    which is gone: FILE holds it, with one warning that it may not be whole on disk."""
    from radixcache.runtime import atomic_file

    def failing(folder: str) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomic_file, "fsync_dir", failing)
    path = tmp_path / "r.jsonl"
    staged = StagedRecording(str(path))
    with open(staged.staging, "wb", buffering=0) as recording, caplog.at_level("WARNING", "radixcache.record"):
        recording.write(b'{"timestamp": 1}\n')
        staged.place()
    assert staged.placed and staged.error is None and staged.finish() is True
    assert path.read_text() == '{"timestamp": 1}\n' and [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]
    assert [r.getMessage() for r in caplog.records] == [
        f"recording {path} may not be whole on disk (Input/output error)"
    ]
