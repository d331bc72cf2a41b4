"""Simulated filesystem errors for the disk tier's tests, so that the error paths run as root too (root ignores
file modes): `deny_writes` makes every change under a folder fail with EACCES as a read-only folder would (creating,
opening for writing, renaming, deleting, touching), `fail_reads` makes reading the files under a folder fail with
an errno other than ENOENT, `fail_unlinks` makes deleting them fail, `unreadable` makes one file unreadable (EACCES)
as a chmod 000 would. Reads of other paths, and every operation outside the folder, behave as usual. Patches go
through pytest's monkeypatch, so they end with the test.
"""

from __future__ import annotations

import builtins
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime.kv.tier import prefetch
from radixcache.runtime.kv.tier.disk_files import read_nofollow_split


def _under(folder: str) -> Callable[[Any], bool]:
    def check(path: Any) -> bool:
        if isinstance(path, int):
            return False  # a descriptor
        p = os.path.abspath(os.fspath(path))
        return p == folder or p.startswith(folder + os.sep)

    return check


def _raise(code: int, path: Any) -> None:
    raise OSError(code, os.strerror(code), os.fspath(path))


def deny_writes(monkeypatch: pytest.MonkeyPatch, folder: str | Path, code: int = errno.EACCES) -> None:
    under = _under(os.path.abspath(folder))
    real_open, real_os_open, real_mkdir = builtins.open, os.open, os.mkdir
    real_replace, real_unlink, real_utime = os.replace, os.unlink, os.utime

    def fake_open(file: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        if under(file) and any(c in mode for c in "wxa+"):
            _raise(code, file)
        return real_open(file, mode, *args, **kw)

    def fake_os_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if under(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            _raise(code, path)
        return real_os_open(path, flags, *args, **kw)

    def fake_mkdir(path: Any, *args: Any, **kw: Any) -> None:
        if under(path) and not os.path.lexists(path):
            _raise(code, path)
        real_mkdir(path, *args, **kw)

    def fake_replace(src: Any, dst: Any, *args: Any, **kw: Any) -> None:
        if under(src) or under(dst):
            _raise(code, dst)
        real_replace(src, dst, *args, **kw)

    def fake_unlink(path: Any, *args: Any, **kw: Any) -> None:
        if under(path):
            _raise(code, path)
        real_unlink(path, *args, **kw)

    def fake_utime(path: Any, *args: Any, **kw: Any) -> None:
        if under(path):
            _raise(code, path)
        real_utime(path, *args, **kw)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    monkeypatch.setattr(os, "replace", fake_replace)
    monkeypatch.setattr(os, "unlink", fake_unlink)
    monkeypatch.setattr(os, "utime", fake_utime)


def fail_reads(monkeypatch: pytest.MonkeyPatch, folder: str | Path, code: int = errno.EIO) -> None:
    """Opening a file under `folder` (for reading: what the store does with a page) fails with `code`. The prefetch
    readers of an engine made meanwhile read in Python (their native read opens files in C, past this fault; its
    own errors are tests.runtime.test_disk_split_reads')."""
    monkeypatch.setattr(prefetch, "split_reader", lambda: read_nofollow_split)
    under = _under(os.path.abspath(folder))
    real_os_open = os.open

    def fake_os_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if under(path) and not flags & os.O_DIRECTORY and not os.path.isdir(path):
            _raise(code, path)
        return real_os_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", fake_os_open)


def fail_unlinks(monkeypatch: pytest.MonkeyPatch, folder: str | Path, code: int = errno.EPERM) -> None:
    under = _under(os.path.abspath(folder))
    real_unlink = os.unlink

    def fake_unlink(path: Any, *args: Any, **kw: Any) -> None:
        if under(path):
            _raise(code, path)
        real_unlink(path, *args, **kw)

    monkeypatch.setattr(os, "unlink", fake_unlink)


def unreadable(monkeypatch: pytest.MonkeyPatch, path: str | Path, code: int = errno.EACCES) -> None:
    """Opening the file now at `path` fails with `code`, as a file whose mode was changed to 000 under the cache (a
    mode belongs to the inode: a file written in its place later reads again, as after a chmod). Readers of an engine
    made meanwhile read in Python, as under `fail_reads`."""
    monkeypatch.setattr(prefetch, "split_reader", lambda: read_nofollow_split)
    bad = os.stat(path)
    real_os_open = os.open

    def fake_os_open(file: Any, flags: int, *args: Any, **kw: Any) -> int:
        if not isinstance(file, int):
            try:
                st = os.stat(file, follow_symlinks=False)
            except OSError:
                st = None
            if st is not None and (st.st_dev, st.st_ino) == (bad.st_dev, bad.st_ino):
                _raise(code, file)
        return real_os_open(file, flags, *args, **kw)

    monkeypatch.setattr(os, "open", fake_os_open)
