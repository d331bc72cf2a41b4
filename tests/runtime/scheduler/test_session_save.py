"""Session.save replaces its file whole: a save that fails while writing keeps the earlier one."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import SimpleNamespace

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
    """The temporary file is named `.NAME.<8 hex>.tmp`: 14 characters more than NAME, so a name of 242 to 255 bytes
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
