"""Helpers for the disk tier's page store tests (radixcache.runtime.kv.tier.disk_store, test_disk_*.py).

Real files under tmp_path, no filesystem mocks. `open_store` opens stores on tmp_path/cache and closes them at
teardown; `h`, `toks` and `payload` make page i's hash, tokens and bytes, `write` stores pages and waits for the
writer, `page_path` is where a page's file lies. The tests import the plain helpers with
`from tests.runtime.conftest import ...`. `no_home`: a user pathlib finds no home folder for.

The native kernels' build tests (test_native_build, test_native_cut_build; xdist group "native_builds") share one
first build per run, `native_build`, and rebuild through `copying_cc`: stand-in compilers that write the machine's
build of the same sources (a build of every kernel is about 18 s of compiler CPU, and they made six, then one).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pwd
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from radixcache.runtime.kv.tier.disk_store import DiskStore
from tests.runtime.native_probes import ProbeServer, probe_environment

FP = "tiny/float32/page4"
META = {"dtype": "float32", "shape": [1, 2, 4, 1, 8]}
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
needs_permissions = pytest.mark.skipif(ROOT, reason="root ignores file permissions")
REPO = Path(__file__).resolve().parents[2]
HAS_CC = shutil.which(os.environ.get("CC", "cc")) is not None


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


# ---------------------------------------------------------------------- the native kernels' build

# Loads the library (building it if needed) and prints what happened as one JSON line.
NATIVE_PROBE = """
import json
from radixcache.runtime.native import NativeBuildError, blockdot
try:
    lib = blockdot()
    try:
        maps = open("/proc/self/maps").read().splitlines()
    except OSError:
        maps = []
    gomp = sorted({line.split()[-1] for line in maps if "libgomp" in line.split()[-1]})
    print(json.dumps({"path": lib._name, "max_tokens": lib.blockdot_max_tokens(), "libgomp": gomp}))
except NativeBuildError as exc:
    print(json.dumps({"error": str(exc), "is_value_error": isinstance(exc, ValueError)}))
"""


@pytest.fixture(scope="session")
def native_probes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProbeServer]:
    """The fork server the native load probes run in (tests/runtime/native_probes.py): one interpreter start with
    torch per worker, not one per probe."""
    server = ProbeServer(tmp_path_factory.mktemp("native-probes"))
    yield server
    server.close()


def run_native_probe(probes: ProbeServer, cache: Path, prelude: str = "", **env: str) -> dict[str, object]:
    """Run NATIVE_PROBE (after `prelude`) in a process of its own (the loader is memoised per process), forked from
    `probes`, with `cache` as the native cache folder (and `env` on top)."""
    got = probes.run(prelude + NATIVE_PROBE, probe_environment(cache, **env))
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout.strip().splitlines()[-1])


class NativeBuild(NamedTuple):
    """The first load of the kernels in an empty cache folder: the folder (read it, never change it), the build
    in it, the probe's report (path, max_tokens, libgomp), and the compiler's arguments."""

    cache: Path
    path: Path
    probe: dict[str, object]
    command: list[str]


def copying_compiler(script: Path, library: Path, log: Path | None = None) -> str:
    """Write at `script` a C compiler stand-in (a CC value) that writes `library` to its `-o` file (and its
    arguments, one a line, to `log`) and answers `--version` with the real compiler's answer, so that its builds get
    the real build's name (the name hashes that answer)."""
    real = os.environ.get("CC", "").strip() or "cc"
    record = f'printf "%s\\n" "$@" > {shlex.quote(str(log))}\n' if log is not None else ""
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = --version ]; then exec {real} "$@"; fi\n'
        f"{record}"
        'while [ $# -gt 1 ]; do if [ "$1" = -o ]; then exec cp '
        f'{shlex.quote(str(library))} "$2"; fi; shift; done\n'
        "exit 1\n"
    )
    script.chmod(0o755)
    return str(script)


@pytest.fixture(scope="session")
def native_build(native_probes: ProbeServer, tmp_path_factory: pytest.TempPathFactory) -> NativeBuild:
    """The kernels' first load, by runtime.native's build on first use in a process of its own, into a cache folder
    that did not exist: once per worker (the build tests' xdist group: once per run). Its compiler writes the build
    this machine has of the same sources, flags, compiler and CPU, `blockdot()`'s in this process (the build every
    kernel test loads: compiled here with the real compiler where the machine had none yet), and records the command
    line the loader gave it. A second real compile of every kernel (about 20 s) built the same bytes."""
    if not HAS_CC:
        pytest.skip("quant='gguf' builds a C kernel: no C compiler here")
    from radixcache.runtime.native import blockdot

    shared = Path(blockdot()._name)
    folder = tmp_path_factory.mktemp("native-build")
    cc = copying_compiler(folder / "cc", shared, log=folder / "cc-args")
    cache = folder / "native"  # does not exist yet: the loader creates it
    probe = run_native_probe(native_probes, cache, CC=cc)
    assert "error" not in probe, probe
    assert Path(str(probe["path"])).name == shared.name  # the same build key: the same sources, flags and compiler
    return NativeBuild(cache, Path(str(probe["path"])), probe, (folder / "cc-args").read_text().splitlines())


@pytest.fixture(scope="session")
def copying_cc(native_build: NativeBuild, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A C compiler stand-in (a CC value, `copying_compiler`) that writes `native_build`'s library: a rebuild
    through it takes the loader's whole path (the staging file, its rename, the load of a real library) without
    compiling the kernels again."""
    return copying_compiler(tmp_path_factory.mktemp("copying-cc") / "cc", native_build.path)
