"""Helpers for the disk tier's page store tests (radixcache.runtime.kv.tier.disk_store, test_disk_*.py).

Real files under tmp_path, no filesystem mocks. `open_store` opens stores on tmp_path/cache and closes them at
teardown; `h`, `toks` and `payload` make page i's hash, tokens and bytes, `write` stores pages and waits for the
writer, `page_path` is where a page's file lies. The tests import the plain helpers with
`from tests.runtime.conftest import ...`. `no_home`: a user pathlib finds no home folder for.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import tempfile
from pathlib import Path

import pytest

from radixcache.runtime.kv.tier.disk_store import DiskStore

FP = "tiny/float32/page4"
META = {"dtype": "float32", "shape": [1, 2, 4, 1, 8]}
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
needs_permissions = pytest.mark.skipif(ROOT, reason="root ignores file permissions")


def h(i: int) -> bytes:
    """A 16-byte page hash, as the runtime's chained hashes are."""
    return hashlib.blake2b(str(i).encode(), digest_size=16).digest()


def toks(i: int) -> list[int]:
    return [4 * i + k for k in range(4)]


def payload(i: int, size: int = 256) -> bytes:
    return bytes((i + k) % 256 for k in range(size))


def disk_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "radixcache.disk" and r.levelno == logging.WARNING]


@pytest.fixture
def open_store(tmp_path: Path):
    """open_store(**kw): a DiskStore on tmp_path/cache (closed at teardown)."""
    stores: list[DiskStore] = []

    def make(directory: Path | None = None, **kw) -> DiskStore:
        kw.setdefault("max_bytes", 1 << 20)
        kw.setdefault("fingerprint", FP)
        store = DiskStore(directory or tmp_path / "cache", **kw)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close(timeout=10)


def write(store: DiskStore, *ids: int, size: int = 256) -> None:
    for i in ids:
        assert store.put(h(i), toks(i), payload(i, size), META)
    assert store.flush(timeout=10)


def page_path(store: DiskStore, page_hash: bytes) -> Path:
    hex_ = page_hash.hex()
    return Path(store.pages_dir) / hex_[:2] / f"{hex_}.kvpage"


@pytest.fixture
def no_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME unset and no passwd entry for this uid (a container run under an arbitrary uid: `Path.home()` raises
    RuntimeError), no cache folder named by the environment, and the temporary directory under tmp_path (returned)."""

    def unknown(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    for name in ("HOME", "XDG_CACHE_HOME", "RADIXCACHE_NATIVE_CACHE", "RADIXCACHE_DIGEST_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", unknown)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(RuntimeError):
        Path.home()
    return tmp_path / "tmp"
