"""radixcache.runtime.atomic_file against a real file system: a write killed at any instant, or refused by a full
disk, leaves the earlier file whole; the new file is synced before its rename and its folder after; the target's
mode, a symlink and a hard link are handled as opening the file for writing would (less the emptying)."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from radixcache.runtime import atomic_file
from radixcache.runtime.atomic_file import Staging, remove_stale_partials, staged, write_bytes

POSIX = pytest.mark.skipif(os.name == "nt", reason="POSIX file modes, signals and folder fsyncs")
NO_PID = 4_194_399  # past Linux's largest pid_max (2**22): no process has it


def _child(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@POSIX
def test_a_writer_killed_mid_write_leaves_the_earlier_file_whole_and_its_leftover_goes(tmp_path: Path) -> None:
    """kill -9 after half the new content went out: FILE is the earlier file, byte for byte; the staging file is
    named after FILE and the dead pid, and the next write of FILE removes it."""
    path = tmp_path / "session.json"
    path.write_text('{"v": 1}')
    child = _child(
        """
        import sys, time
        from radixcache.runtime.atomic_file import staged
        with staged(sys.argv[1]) as staging, open(staging, "w") as f:
            f.write('{"v": 2, "pad": "' + "x" * 100_000)
            f.flush()
            print(staging, flush=True)
            time.sleep(60)
            f.write('"}')
        """,
        str(path),
    )
    assert child.stdout is not None
    staging = Path(child.stdout.readline().strip())
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert json.loads(path.read_text()) == {"v": 1}
    assert staging.exists() and staging.parent == tmp_path
    assert re.fullmatch(rf"\.session\.json\.{child.pid}-[0-9a-f]{{8}}\.partial", staging.name)
    write_bytes(path, b'{"v": 3}')
    assert json.loads(path.read_text()) == {"v": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["session.json"]


@POSIX
def test_a_writer_killed_at_any_instant_leaves_one_whole_version(tmp_path: Path) -> None:
    """A child replaces FILE with ever newer versions (each 200 kB, ending in its own number) until killed; at
    whatever instant the kill lands, FILE is one version whole."""
    path = tmp_path / "plan.json"
    write_bytes(path, json.dumps({"v": 0, "pad": "x" * 200_000}).encode())
    for _ in range(3):
        child = _child(
            """
            import json, sys
            from radixcache.runtime.atomic_file import write_bytes
            for v in range(1, 10**9):
                write_bytes(sys.argv[1], json.dumps({"v": v, "pad": "x" * 200_000}).encode())
                if v == 3:
                    print("going", flush=True)
            """,
            str(path),
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "going"
        child.send_signal(signal.SIGKILL)
        child.wait()
        version = json.loads(path.read_text())
        assert version["v"] >= 3 and version["pad"] == "x" * 200_000


@POSIX
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_full_disk_names_the_file_and_keeps_the_earlier_one(tmp_path: Path) -> None:
    """A write past the process's file size limit (EFBIG, as a full disk's ENOSPC: a write's error names no file)
    raises an OSError naming FILE, as the caller gave it; FILE stays as it was and no staging file is left."""
    path = tmp_path / "trace.jsonl"
    path.write_text("earlier\n")
    child = _child(
        """
        import json, resource, signal, sys
        from radixcache.runtime.atomic_file import write_bytes
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            write_bytes(sys.argv[1], b"x" * 100_000)
        except OSError as exc:
            print(json.dumps([exc.errno, exc.filename, str(exc)]))
        """,
        str(path),
    )
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    code, filename, message = json.loads(out)
    assert (code, filename) == (errno.EFBIG, str(path)) and str(path) in message
    assert path.read_text() == "earlier\n"
    assert [p.name for p in tmp_path.iterdir()] == ["trace.jsonl"]


def test_a_sync_that_finds_the_disk_full_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system that allocates late reports ENOSPC at the fsync: named FILE, the earlier file kept."""
    path = tmp_path / "out.json"
    path.write_text("earlier")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic_file.os, "fsync", full)
    with pytest.raises(OSError) as refused:
        write_bytes(path, b"new")
    assert (refused.value.errno, refused.value.filename) == (errno.ENOSPC, str(path))
    assert path.read_text() == "earlier" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


@POSIX
def test_the_file_is_synced_before_its_rename_and_its_folder_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "out.json"
    path.write_text("earlier")
    real_fsync = os.fsync
    synced: list[tuple[str, int, bytes]] = []  # (kind, inode, what FILE held then)

    def watching(fd: int) -> None:
        st = os.fstat(fd)
        synced.append(("folder" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino, path.read_bytes()))
        real_fsync(fd)

    monkeypatch.setattr(atomic_file.os, "fsync", watching)
    write_bytes(path, b"new")
    assert synced == [("file", path.stat().st_ino, b"earlier"), ("folder", tmp_path.stat().st_ino, b"new")]


@POSIX
def test_an_existing_files_mode_is_kept_and_a_new_file_gets_the_umasks(tmp_path: Path) -> None:
    kept = tmp_path / "kept.json"
    kept.write_text("a")
    kept.chmod(0o640)
    write_bytes(kept, b"b")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_bytes() == b"b"
    umask = os.umask(0o022)
    os.umask(umask)
    new = tmp_path / "new.json"
    write_bytes(new, b"c")
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~umask


@POSIX
def test_a_symlink_writes_its_target_and_stays_a_link(tmp_path: Path) -> None:
    target, link, dangling = tmp_path / "real.json", tmp_path / "link.json", tmp_path / "dangling.json"
    target.write_text("earlier")
    link.symlink_to(target)
    dangling.symlink_to(tmp_path / "made.json")
    write_bytes(link, b"new")
    write_bytes(dangling, b"made")
    assert link.is_symlink() and target.read_bytes() == b"new"
    assert dangling.is_symlink() and (tmp_path / "made.json").read_bytes() == b"made"


@POSIX
def test_a_hard_link_keeps_the_earlier_content_under_its_other_name(tmp_path: Path) -> None:
    """Writing FILE never empties another name of the same file (as opening FILE for writing would)."""
    path, other = tmp_path / "out.json", tmp_path / "trace.jsonl"
    other.write_text("the trace")
    os.link(other, path)
    write_bytes(path, b"the result")
    assert other.read_text() == "the trace" and path.read_bytes() == b"the result"


def test_a_target_that_is_no_regular_file_is_written_directly(tmp_path: Path) -> None:
    staging = Staging(os.devnull)
    assert staging.direct and staging.path == os.path.realpath(os.devnull)
    write_bytes(os.devnull, b"nothing")  # no rename onto /dev/null
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_missing_folder_names_the_path_given(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "out.json"
    with pytest.raises(FileNotFoundError) as refused:
        write_bytes(path, b"x")
    assert refused.value.filename == str(path)


def test_an_error_in_the_block_removes_the_staging_file_and_names_the_path(tmp_path: Path) -> None:
    """A writer's error that names the staging file (its open's) names FILE; the staging file goes, on Ctrl-C too."""
    path = tmp_path / "out.jsonl"
    path.write_text("earlier")
    with pytest.raises(OSError) as refused, staged(path) as staging:
        Path(staging).write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), staging)
    assert (refused.value.errno, refused.value.filename) == (errno.ENOSPC, str(path))
    with pytest.raises(KeyboardInterrupt), staged(path) as staging:
        Path(staging).write_text("half")
        raise KeyboardInterrupt
    assert path.read_text() == "earlier" and [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_a_name_near_the_file_systems_limit_still_writes(tmp_path: Path) -> None:
    """A 245-byte name fits the file system; `.NAME.<pid>-<8 hex>.partial` would not: its hash stands for it, and a
    killed writer's leftover under that hash goes with the next write."""
    path = tmp_path / ("s" * 245)
    leftover = tmp_path / f".{atomic_file._hashed(path.name)}.{NO_PID}-0123abcd.partial"
    leftover.write_text("half")
    with staged(path) as staging:
        assert Path(staging).name.startswith(f".{atomic_file._hashed(path.name)}.{os.getpid()}-")
        Path(staging).write_text("a")
    write_bytes(path, b"b")
    assert path.read_bytes() == b"b" and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_stale_staging_files_of_either_form_go_and_live_ones_stay(tmp_path: Path) -> None:
    """Both forms of a dead pid's staging file go (a one-shot write's and a recording's); this process's own, a
    live pid's, another file's and a name of another shape stay."""
    names = {
        f".f.json.{NO_PID}-0123abcd.partial": False,
        f".f.json.{NO_PID}.partial": False,
        f".f.json.{os.getpid()}-0123abcd.partial": True,
        f".f.json.{os.getppid()}.partial": True,
        f".g.json.{NO_PID}-0123abcd.partial": True,
        f".f.json.{NO_PID}-0123ABCD.partial": True,
        f".f.json.5.{NO_PID}.partial": True,  # FILE f.json.5's
    }
    for name in names:
        (tmp_path / name).write_text("x")
    removed = remove_stale_partials(str(tmp_path), "f.json")
    assert sorted(removed) == sorted(str(tmp_path / n) for n, kept in names.items() if not kept)
    assert {p.name for p in tmp_path.iterdir()} == {n for n, kept in names.items() if kept}


@POSIX
@pytest.mark.parametrize("code", [errno.EINVAL, errno.EIO])
def test_a_folder_the_file_system_cannot_sync_is_no_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """Some file systems (CIFS, some FUSE ones) refuse to fsync a folder (EINVAL): the file was renamed into place,
    so the write stands, as SQLite takes it. A folder whose sync fails for the disk (EIO) is an error naming FILE."""
    path = tmp_path / "out.json"
    real_fsync = os.fsync

    def refusing_folders(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(atomic_file.os, "fsync", refusing_folders)
    if code == errno.EINVAL:
        write_bytes(path, b"new")
    else:
        with pytest.raises(OSError) as failed:
            write_bytes(path, b"new")
        assert (failed.value.errno, failed.value.filename) == (errno.EIO, str(path))
    assert path.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["out.json"]
