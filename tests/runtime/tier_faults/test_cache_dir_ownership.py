"""What `--cache-dir` may touch: a directory is adopted only with its marker (or when empty), only files of the
store's own naming are ever deleted, and no symlink is followed, so a user's files under a folder named like the
store's (`work/tmp/thesis.tex`, a `tmp -> victim` symlink) survive every open and every `clear`.

Each case is a real directory under tmp_path; the expectations are the user's files, byte for byte.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from radixcache.runtime.kv.tier.disk_store import MARKER_NAME, DiskStore
from tests.runtime.conftest import META, h, payload, toks, write


def test_a_directory_holding_only_a_tmp_folder_is_not_adopted(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "tmp").mkdir(parents=True)
    thesis = work / "tmp" / "thesis.tex"
    thesis.write_text("\\chapter{Results}")
    store = DiskStore(work, max_bytes=1 << 20)
    assert not store.enabled
    assert not store.put(h(0), toks(0), payload(0), META)
    assert thesis.read_text() == "\\chapter{Results}"
    assert sorted(p.name for p in work.iterdir()) == ["tmp"]  # no marker, no pages/ written
    with pytest.raises(ValueError):
        store.clear()
    assert thesis.exists()


def test_a_directory_holding_only_a_pages_folder_is_not_adopted(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "pages").mkdir(parents=True)
    (work / "pages" / "index.html").write_text("<p>mine</p>")
    store = DiskStore(work, max_bytes=1 << 20)
    assert not store.enabled
    assert sorted(p.name for p in work.iterdir()) == ["pages"]
    assert (work / "pages" / "index.html").read_text() == "<p>mine</p>"


def test_only_the_stores_own_temporary_names_are_removed(open_store) -> None:
    store = open_store()
    store.close()
    tmp = Path(store.tmp_dir)
    dead = tmp / f"{2**22 + 1}-0123456789abcdef.tmp"  # the store's exact pattern, a dead writer: removed
    lookalikes = [tmp / "thesis.tex", tmp / "notes.tmp", tmp / f"{2**22 + 1}-draft.tmp", tmp / "123-0123456789abcdef"]
    for f in [dead, *lookalikes]:
        f.write_text("keep me")
    sub = tmp / f"{2**22 + 1}-fedcba9876543210.tmp"
    sub.mkdir()  # a folder named like a temporary file is not a file of ours
    open_store().close()
    assert not dead.exists()
    assert all(f.read_text() == "keep me" for f in lookalikes)
    assert sub.is_dir()


def test_a_tmp_symlink_to_another_folder_leaves_that_folder_intact(tmp_path: Path, open_store) -> None:
    store = open_store()
    write(store, 0)
    store.close()
    victim = tmp_path / "victim"
    victim.mkdir()
    planted = [victim / f"{2**22 + 1}-0123456789abcdef.tmp", victim / "report.docx"]  # one even has our pattern
    for f in planted:
        f.write_text("precious")
    tmp = Path(store.tmp_dir)
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()
    tmp.symlink_to(victim, target_is_directory=True)
    reopened = open_store()
    assert all(f.read_text() == "precious" for f in planted)
    assert not reopened.put(h(1), toks(1), payload(1), META)  # refuses to write through the link
    with pytest.raises(ValueError):
        reopened.clear()
    assert all(f.read_text() == "precious" for f in planted)
    assert sorted(p.name for p in victim.iterdir()) == sorted(f.name for f in planted)


def test_a_pages_symlink_is_not_followed_by_clear(tmp_path: Path, open_store) -> None:
    store = open_store()
    write(store, 0)
    store.close()
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    outside = DiskStore(victim, max_bytes=1 << 20, fingerprint="tiny/float32/page4")  # a real cache elsewhere
    write(outside, 3)
    outside.close()
    pages = Path(store.pages_root)
    for f in sorted(pages.rglob("*"), key=lambda p: -len(p.parts)):
        f.unlink() if f.is_file() else f.rmdir()
    pages.rmdir()
    pages.symlink_to(victim / "pages", target_is_directory=True)
    reopened = open_store()
    with pytest.raises(ValueError):
        reopened.clear()
    assert len(list((victim / "pages").rglob("*.kvpage"))) == 1


def test_a_directory_left_by_a_kill_during_the_marker_write_is_adopted(tmp_path: Path) -> None:
    cut = tmp_path / "cut"
    cut.mkdir()
    half = cut / f"{2**22 + 1}-0123456789abcdef.tmp"  # the marker's temporary file, its writer killed
    half.write_text('{"format": "radixc')
    with DiskStore(cut, max_bytes=1 << 20) as store:
        assert store.enabled
        write(store, 0)
    assert not half.exists() and (cut / MARKER_NAME).is_file()


def test_an_empty_directory_is_adopted_marker_first(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with DiskStore(fresh, max_bytes=1 << 20) as store:
        assert store.enabled
        write(store, 0)
        assert store.read(h(0), toks(0)) == (payload(0), META)
    assert (fresh / MARKER_NAME).is_file()


def test_page_files_and_the_marker_are_written_fsync_rename_fsync(tmp_path: Path, monkeypatch) -> None:
    """The order of the system calls behind every file the store writes: the data reaches the disk before the name,
    and the name before the write counts as done."""
    import radixcache.runtime.kv.tier.disk_files as files

    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        calls.append("rename:" + os.path.basename(dst))
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "fsync", fsync)
    monkeypatch.setattr(files.os, "replace", replace)
    with DiskStore(tmp_path / "fresh", max_bytes=1 << 20) as store:
        write(store, 0)
    marker = calls.index("rename:" + MARKER_NAME)
    assert calls[marker - 1 : marker + 2] == ["fsync-file", "rename:" + MARKER_NAME, "fsync-dir"]
    page = next(i for i, c in enumerate(calls) if c.endswith(".kvpage"))
    assert calls[page - 1 : page + 2] == ["fsync-file", calls[page], "fsync-dir"]
