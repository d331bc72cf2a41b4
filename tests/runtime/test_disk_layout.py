"""The disk tier's cache directory (radixcache.runtime.kv.tier.disk_layout): what a store adopts and what it leaves.

Covers leftovers of a killed writer removed at open, a folder without the marker or with another format version
left alone, `create=False`, a directory that cannot be written (opened disabled, its pages still served; the
read-only folder is simulated, so the tests run as root too), and
`clear` (pages and temporary files go, the marker stays; never a folder without the marker).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from radixcache.runtime.kv.tier.disk_files import live_temp
from radixcache.runtime.kv.tier.disk_store import MARKER_NAME, DiskStore
from tests.runtime.conftest import FP, META, disk_warnings, h, page_path, payload, toks, write
from tests.runtime.tier_faults.fs_faults import deny_writes


def test_leftover_temporary_files_are_removed_at_open(open_store, tmp_path: Path) -> None:
    store = open_store()
    write(store, 0)
    store.close()
    tmp = Path(store.tmp_dir)
    dead = tmp / f"{2**22 + 1}-0123456789abcdef.tmp"  # above any Linux pid: its writer is gone (kill -9)
    odd = tmp / "garbage.tmp"  # not a name the store gives: not its file, kept
    huge = tmp / f"{10**30}-0123456789abcdef.tmp"  # no pid at all
    alive = tmp / f"{os.getppid()}-fedcba9876543210.tmp"  # a live writer's (another process)
    stale = tmp / f"{os.getppid()}-00000000aaaaaaaa.tmp"  # alive, but no write takes an hour
    for f in (dead, odd, huge, alive, stale):
        f.write_bytes(b"half a page")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    with live_temp(str(tmp)) as writing:  # another store of this process, writing
        Path(writing).write_bytes(b"half a page")
        reopened = open_store()
        assert Path(writing).exists()
    assert not dead.exists() and not huge.exists() and not stale.exists()
    assert alive.exists() and odd.exists()
    assert reopened.read(h(0), toks(0)) == (payload(0), META)


def test_a_temporary_file_left_under_this_processs_own_pid_is_removed_at_open(open_store) -> None:
    """A file named with this process's pid was kept as a live writer's, for an hour: but a pid is reused across a
    restart (a container's server is often pid 1 every time), so what a process killed mid-write left looked like
    this process's own, uncounted by the size limit and kept while the server ran. Only a write under way is kept."""
    store = open_store()
    store.close()
    left = Path(store.tmp_dir) / f"{os.getpid()}-fedcba9876543210.tmp"
    left.write_bytes(b"half a page")
    open_store()
    assert not left.exists()


def test_a_non_empty_directory_without_the_marker_is_not_adopted(tmp_path: Path, caplog) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    store = DiskStore(home, max_bytes=1 << 20)
    assert not store.enabled
    assert not store.put(h(0), toks(0), b"x", META)
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt"]
    assert len(disk_warnings(caplog)) == 1
    with pytest.raises(ValueError, match=str(home)):
        store.clear()
    assert (home / "notes.txt").read_text() == "mine"


def test_another_format_version_is_left_alone(open_store, caplog) -> None:
    store = open_store()
    write(store, 0)
    store.close()
    marker = Path(store.directory) / MARKER_NAME
    marker.write_text(json.dumps({"format": "radixcache-kv-pages", "version": 99}))
    newer = open_store()
    assert not newer.enabled and newer.count_prefix([h(0)]) == 0
    assert newer.read(h(0), toks(0)) is None
    assert page_path(store, h(0)).exists()  # not taken for corrupt
    assert len(disk_warnings(caplog)) == 1


def test_create_false_only_opens_an_existing_cache(tmp_path: Path, open_store) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        DiskStore(tmp_path / "nope", max_bytes=0, create=False)
    assert not (tmp_path / "nope").exists()
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(ValueError, match="not a radixcache cache"):
        DiskStore(plain, max_bytes=0, create=False)
    assert list(plain.iterdir()) == []
    write(open_store(), 0)
    inspect = DiskStore(tmp_path / "cache", max_bytes=0, create=False)
    assert inspect.stats().pages == 1 and not inspect.enabled
    assert inspect.read(h(0), toks(0)) == (payload(0), META)


def test_an_unwritable_directory_opens_disabled(tmp_path: Path, caplog, monkeypatch) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    deny_writes(monkeypatch, parent)  # a read-only folder, simulated: file modes do not stop root
    store = DiskStore(parent / "cache", max_bytes=1 << 20)
    assert not store.enabled
    assert not store.put(h(0), toks(0), payload(0), META)
    assert store.count_prefix([h(0)]) == 0 and store.read(h(0), toks(0)) is None
    assert len(disk_warnings(caplog)) == 1
    assert list(parent.iterdir()) == []


def test_a_read_only_cache_still_serves_its_pages(open_store, caplog, monkeypatch) -> None:
    store = open_store()
    write(store, 0)
    store.close()
    deny_writes(monkeypatch, store.directory)
    ro = open_store()
    assert not ro.enabled and len(disk_warnings(caplog)) == 1
    assert ro.read(h(0), toks(0)) == (payload(0), META)
    assert not ro.put(h(1), toks(1), payload(1), META)


def test_clear_deletes_pages_and_temporary_files(open_store) -> None:
    store = open_store()
    write(store, 0, 1, 2)
    (Path(store.tmp_dir) / f"{os.getpid()}-0123456789abcdef.tmp").write_bytes(b"x")  # a live writer's: cleared
    (Path(store.tmp_dir) / "garbage.tmp").write_bytes(b"x")  # not the store's naming: kept
    assert store.clear() == 3
    assert store.stats().pages == 0 and store.count_prefix([h(0)]) == 0
    assert list(Path(store.pages_dir).rglob("*.kvpage")) == []
    assert [p.name for p in Path(store.tmp_dir).iterdir()] == ["garbage.tmp"]
    assert (Path(store.directory) / MARKER_NAME).exists()
    assert open_store().stats().pages == 0
    write(store, 4)  # still usable
    assert store.read(h(4), toks(4)) == (payload(4), META)


def test_clear_refuses_a_directory_without_the_marker(open_store) -> None:
    store = open_store()
    write(store, 0)
    (Path(store.directory) / MARKER_NAME).unlink()
    with pytest.raises(ValueError, match=str(store.directory)):
        store.clear()
    assert page_path(store, h(0)).exists()


def test_a_cache_directory_under_a_tilde_is_in_the_home_folder(tmp_path: Path, monkeypatch) -> None:
    """cache_dir="~/kv" (the Python API, a config file, `--cache-dir=~/kv`, which no shell expands) made a folder named
    "~" in the working directory, as the model's path ("~/model.gguf") does not: the cache moved with the cwd, `cache
    stats ~/kv` found nothing, and removing the stray "~" the way one would is `rm -r ~`."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    with DiskStore("~/kv", max_bytes=1 << 20, fingerprint=FP) as store:
        write(store, 0)
        assert store.directory == str(home / "kv")
    assert list(cwd.iterdir()) == []
    with DiskStore(home / "kv", max_bytes=1 << 20, fingerprint=FP) as again:
        assert again.read(h(0), toks(0)) == (payload(0), META)


def test_a_tilde_with_no_home_folder_is_refused_by_name(no_home: Path, monkeypatch) -> None:
    monkeypatch.chdir(no_home)
    with pytest.raises(ValueError, match=r"'~/kv'.*no home folder"):
        DiskStore("~/kv", max_bytes=1 << 20)
    assert not (no_home / "~").exists()


def test_an_empty_cache_directory_is_refused_not_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    """cache_dir="" (`--cache-dir "$CACHE"` with CACHE unset) was the working directory (abspath of ""): an empty
    one was adopted, its marker and pages written into it."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="empty"):
        DiskStore("", max_bytes=1 << 20, fingerprint=FP)
    assert list(tmp_path.iterdir()) == []
