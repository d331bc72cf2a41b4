"""Session.save replaces its file whole: a save that fails while writing, or is killed, keeps the earlier one, and
the new file is on the disk (fsynced, then its folder) before it counts as saved."""

from __future__ import annotations

import builtins
import json
import os
import re
import signal
import stat
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from radixcache.runtime.engine.session import Session

resource = pytest.importorskip("resource")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_save_that_fails_while_writing_keeps_the_earlier_save(tmp_path: Path) -> None:
    """save() truncated the file, then a write that failed part way (a full disk; here the process's file size
    limit, EFBIG) left the earlier save cut short: Session.load failed on it (JSONDecodeError)."""
    engine = SimpleNamespace()  # save and load never reach the engine
    path = tmp_path / "session.json"
    s = Session(engine, system="be brief.", max_new_tokens=3)  # type: ignore[arg-type]
    s.messages.append({"role": "user", "content": "hi"})
    s.save(path)
    before = path.read_bytes()
    s.messages.append({"role": "assistant", "content": "x" * 20_000})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of a signal
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 1000, hard))
        with pytest.raises(OSError):
            s.save(path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert path.read_bytes() == before
    assert Session.load(engine, path).messages == s.messages[:-1]  # type: ignore[arg-type]
    assert [p.name for p in tmp_path.iterdir()] == ["session.json"], "no partial file is left beside it"
    s.save(path)  # and a save that succeeds replaces it
    assert Session.load(engine, path).messages == s.messages  # type: ignore[arg-type]


def test_saving_through_a_symlink_writes_its_target(tmp_path: Path) -> None:
    target, link = tmp_path / "real.json", tmp_path / "link.json"
    target.write_text("{}")
    link.symlink_to(target)
    Session(SimpleNamespace(), system="hi").save(link)  # type: ignore[arg-type]
    assert link.is_symlink() and Session.load(SimpleNamespace(), target).messages[0]["content"] == "hi"  # type: ignore[arg-type]


def test_a_file_name_near_the_file_systems_limit_still_saves(tmp_path: Path) -> None:
    """The temporary file was named `.NAME.<8 hex>.tmp`: 14 characters more than NAME, so a name of 242 to 255 bytes
    (which the file system takes, and a save before the temporary file took) failed with ENAMETOOLONG."""
    engine = SimpleNamespace()
    path = tmp_path / ("s" * 245 + ".json")
    s = Session(engine, system="hi")  # type: ignore[arg-type]
    s.save(path)
    s.messages.append({"role": "user", "content": "again"})
    s.save(path)  # replaces it
    assert Session.load(engine, path).messages == s.messages  # type: ignore[arg-type]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_save_into_a_missing_folder_names_the_path_given(tmp_path: Path) -> None:
    """The error of a save that cannot create its file named the hidden temporary file beside it."""
    path = tmp_path / "missing" / "session.json"
    with pytest.raises(FileNotFoundError) as refused:
        Session(SimpleNamespace(), system="hi").save(path)  # type: ignore[arg-type]
    assert refused.value.filename == str(path)


@pytest.mark.skipif(os.name == "nt", reason="folder fsyncs are POSIX")
def test_a_save_is_synced_before_it_replaces_the_earlier_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """save() renamed its new file over the earlier one without an fsync: after a power cut the new name could hold
    an empty or short file (ext4's delayed allocation) and the earlier save was gone. Now the new file's own
    descriptor is fsynced while `path` still holds the earlier save, then the folder once `path` is the new file."""
    engine = SimpleNamespace()
    path = tmp_path / "session.json"
    s = Session(engine, system="be brief.")  # type: ignore[arg-type]
    s.save(path)
    before = path.read_bytes()
    s.messages.append({"role": "user", "content": "hi"})
    real_fsync = os.fsync
    synced: list[tuple[str, int, bytes]] = []  # (what the descriptor is, its inode, what `path` held then)

    def watching(fd: int) -> None:
        st = os.fstat(fd)
        synced.append(("folder" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino, path.read_bytes()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", watching)
    s.save(path)
    after = path.read_bytes()
    assert json.loads(after)["messages"][-1] == {"role": "user", "content": "hi"}
    assert synced == [("file", path.stat().st_ino, before), ("folder", tmp_path.stat().st_ino, after)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork and SIGKILL are POSIX only")
def test_a_save_killed_mid_write_keeps_the_earlier_save(tmp_path: Path) -> None:
    """A process killed (kill -9) while its save is being written leaves the earlier save whole and loadable; the
    leftover beside it goes with the next save."""
    engine = SimpleNamespace()
    path = tmp_path / "session.json"
    Session(engine, system="first").save(path)  # type: ignore[arg-type]
    ready, told = os.pipe()
    pid = os.fork()  # this process's copy (its modules imported already) saves, and is killed mid-write
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(ready)
            real_open = builtins.open

            class Half:  # a file opened for writing that writes half of what it is given, then waits to be killed
                def __init__(self, f: Any) -> None:
                    self.f = f

                def __enter__(self) -> Half:
                    return self

                def __exit__(self, *exc: object) -> None:
                    self.f.close()

                def write(self, data: bytes) -> None:
                    self.f.write(data[: len(data) // 2])
                    self.f.flush()
                    os.write(told, b"half\n")
                    time.sleep(60)

            def opening(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
                f = real_open(file, mode, *args, **kwargs)
                return Half(f) if mode == "wb" else f

            builtins.open = opening
            s = Session(SimpleNamespace(), system="second")  # type: ignore[arg-type]
            s.messages.append({"role": "user", "content": "x" * 50_000})
            s.save(path)
        finally:
            os._exit(1)
    os.close(told)
    try:
        assert os.read(ready, 5) == b"half\n"
    finally:
        os.close(ready)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert Session.load(engine, path).messages == [{"role": "system", "content": "first"}]  # type: ignore[arg-type]
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "session.json"]
    assert len(leftovers) == 1 and re.fullmatch(rf"\.session\.json\.{pid}-[0-9a-f]{{8}}\.partial", leftovers[0])
    Session(engine, system="third").save(path)  # type: ignore[arg-type]
    assert [p.name for p in tmp_path.iterdir()] == ["session.json"]
