"""runtime.native's build-on-first-use, in processes of their own (the loader is memoised per process; forked from
`native_probes`, tests/runtime/native_probes.py), each with its own `RADIXCACHE_NATIVE_CACHE`: the library is built
into that folder, binds to the one libgomp torch loaded, and a second process loads the same file without
rebuilding it (same name, same mtime), even from a read-only folder (an empty read-only one is named in the
error); a missing or failing compiler gives a NativeBuildError (a ValueError)
naming the compiler and leaves no partial file behind; CC may be a command line (a wrapper and the compiler).
The first build is `native_build` (tests/runtime/conftest.py: its compiler writes the machine's build of the same
sources, flags, compiler and CPU, and records its command line); the other tests copy it or rebuild through
`copying_cc`, a stand-in compiler that writes it.
`check_quant("gguf", ...)` against its rules: it passes on the CPU in float32 where a compiler exists, and names
the device or dtype it refuses.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from radixcache.runtime.model.quant import check_quant
from radixcache.runtime.native import BUILDS_KEPT, FLAGS, LIBS, SOURCES, tidy_cache
from tests.runtime.conftest import HAS_CC, NativeBuild, run_native_probe
from tests.runtime.native_probes import ProbeServer

needs_cc = pytest.mark.skipif(not HAS_CC, reason="quant='gguf' builds a C kernel: no C compiler here")
# xdist group: one worker runs the build tests, so the kernels are compiled once per run (tests/runtime/conftest.py)
pytestmark = pytest.mark.xdist_group("native_builds")


def umask_of_this_process() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_tidy_cache_removes_killed_builds_temporaries_and_all_but_the_newest_other_builds(tmp_path: Path) -> None:
    """A build killed mid-compile left its temporary file for good, and every source change left one more build
    behind (103 files here after a month of development). tidy_cache runs after each build."""
    now = 1_000_000.0
    files = {"tmpold.so": now - 2 * 3600, "tmpyoung.so": now - 60, "blockdot-current.so": now - 10}
    old_partial = f".blockdot-{'a' * 16}.so.{os.getppid()}-0123abcd.partial"  # a live pid's: the age decides
    files |= {old_partial: now - 2 * 3600, f".blockdot-{'b' * 16}.so.{os.getppid()}-0123abcd.partial": now - 60}
    files |= {f"blockdot-{i:016x}.so": now - 100 * (i + 1) for i in range(12)}  # i = 0 is the newest
    files |= {"notes.txt": now - 10**6, "tmpold.txt": now - 10**6}  # not the cache's: left alone
    for name, mtime in files.items():
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (mtime, mtime))
    removed = tidy_cache(tmp_path, keep="blockdot-current.so", now=now)
    oldest = [f"blockdot-{i:016x}.so" for i in range(BUILDS_KEPT, 12)]
    assert sorted(p.name for p in removed) == sorted(["tmpold.so", old_partial, *oldest])
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(set(files) - {"tmpold.so", old_partial, *oldest})
    assert tidy_cache(tmp_path, keep="blockdot-current.so", now=now) == []  # nothing more to remove


@pytest.mark.skipif(os.name == "nt", reason="POSIX file modes and folder fsyncs")
def test_a_build_is_synced_its_folder_too_and_a_killed_builds_file_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build was fsynced and renamed into place, but its folder was not synced (a crash could lose the name, and
    the next start compiles again), and a build killed mid-compile left `tmpXXXX.so` for an hour. The compiler's
    output (here a stand-in that writes its `-o` file) is synced while `path` is missing, then the folder; the
    build gets a plain `cc -o`'s mode; a dead build's staging file of the same `path` goes at once."""
    from radixcache.runtime import native

    compiler = tmp_path / "fake-cc"
    compiler.write_text("import sys\nopen(sys.argv[sys.argv.index('-o') + 1], 'wb').write(b'ELF')\n")
    cache = tmp_path / "native"
    cache.mkdir()
    path = cache / f"blockdot-{'c' * 16}.so"
    dead = cache / f".{path.name}.4194399-0123abcd.partial"  # no process has pid 4194399
    dead.write_bytes(b"half a build")
    real_fsync = os.fsync
    synced: list[tuple[int, bool]] = []  # (the descriptor's inode, whether `path` existed then)

    def watching(fd: int) -> None:
        synced.append((os.fstat(fd).st_ino, path.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", watching)
    native._build([sys.executable, str(compiler)], path)
    assert path.read_bytes() == b"ELF" and (path.stat().st_mode & 0o777) == 0o755 & ~umask_of_this_process()
    assert synced == [(path.stat().st_ino, False), (cache.stat().st_ino, True)]
    assert [p.name for p in cache.iterdir()] == [path.name]


@needs_cc
def test_the_library_is_built_into_the_cache_once_and_reused(
    native_build: NativeBuild, native_probes: ProbeServer
) -> None:
    """`native_build` is the first load in a folder that did not exist; its compiler was given every kernel source
    with the build's flags, and wrote its output where the loader moved it from."""
    cache, first = native_build.cache, native_build.probe
    built = Path(str(first["path"]))
    *compiled, out, lib = native_build.command
    assert compiled == [*FLAGS, *map(str, SOURCES), "-o"] and [lib] == list(LIBS)
    assert Path(out).parent == cache and Path(out).name.startswith(f".{built.name}.")  # a staging file beside it
    assert built.parent == cache and built.name.startswith("blockdot-") and built.suffix == ".so"
    assert sorted(p.name for p in cache.iterdir()) == [built.name]  # no temporary file left over
    assert built.stat().st_mode & 0o777 == 0o755 & ~umask_of_this_process()  # as `cc -o` would (was 0711)
    assert first["max_tokens"] == 8
    if sys.platform.startswith("linux") and first["libgomp"]:
        assert len(first["libgomp"]) == 1, first["libgomp"]  # bound to torch's libgomp, not a second copy
    mtime = built.stat().st_mtime_ns
    second = run_native_probe(native_probes, cache)
    assert second["path"] == first["path"]
    assert built.stat().st_mtime_ns == mtime  # loaded, not rebuilt
    assert sorted(p.name for p in cache.iterdir()) == [built.name]


@needs_cc
def test_a_build_in_a_read_only_cache_is_loaded(
    native_build: NativeBuild, native_probes: ProbeServer, tmp_path: Path
) -> None:
    """A prebuilt cache mounted read-only (or owned by another user) holds the build this process needs: it is loaded,
    not refused for want of a writable folder. (os.access is stubbed: root may write whatever the mode says.)"""
    cache = tmp_path / "native"
    cache.mkdir()
    built = {"path": str(shutil.copy2(native_build.path, cache / native_build.path.name))}  # a prebuilt cache
    deny = "import os; _a = os.access; os.access = lambda p, m, **k: False if m & os.W_OK else _a(p, m, **k)\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder in (cache, empty):
        folder.chmod(0o555)
    try:
        got = run_native_probe(native_probes, cache, deny)
        refused = run_native_probe(native_probes, empty, deny)
    finally:
        for folder in (cache, empty):
            folder.chmod(0o755)
    assert got.get("path") == built["path"], got
    got = refused
    assert "no writable folder" in str(got.get("error")) and str(empty) in str(got.get("error")), got


@needs_cc
def test_a_compiler_command_line_in_cc_is_run_as_one(
    copying_cc: str, native_probes: ProbeServer, tmp_path: Path
) -> None:
    """CC may carry a wrapper or flags ("ccache gcc", as make takes it): it was looked up as one program name and
    quant="gguf" was refused for a compiler that was there. Here `env` stands in for the wrapper, and `copying_cc`
    (tests/runtime/conftest.py: it writes the run's one real build) for the compiler."""
    env = shutil.which("env")
    if env is None:
        pytest.skip("no `env` program to stand in for a compiler wrapper")
    cache = tmp_path / "native"
    got = run_native_probe(native_probes, cache, CC=f"{env} {copying_cc}")
    assert "error" not in got, got
    assert Path(str(got["path"])).parent == cache and got["max_tokens"] == 8
    bad = run_native_probe(native_probes, tmp_path / "other", CC="'cc")
    assert "is not a command line" in str(bad.get("error")), bad


def test_a_missing_compiler_is_a_native_build_error_naming_it(native_probes: ProbeServer, tmp_path: Path) -> None:
    cache = tmp_path / "empty"
    cache.mkdir()
    got = run_native_probe(native_probes, cache, CC="/nonexistent/cc")
    assert got.get("is_value_error") is True, got
    assert "/nonexistent/cc" in str(got["error"]) and "C compiler" in str(got["error"])
    assert list(cache.iterdir()) == []


def test_a_failing_compiler_is_a_native_build_error_naming_it(native_probes: ProbeServer, tmp_path: Path) -> None:
    false = shutil.which("false")
    if false is None:
        pytest.skip("no `false` program to stand in for a failing compiler")
    cache = tmp_path / "empty"
    cache.mkdir()
    got = run_native_probe(native_probes, cache, CC=false)
    assert got.get("is_value_error") is True, got
    assert false in str(got["error"]) and "failed" in str(got["error"])
    assert list(cache.iterdir()) == []  # the temporary output is removed


@needs_cc
def test_check_quant_passes_gguf_on_the_cpu_in_float32() -> None:
    check_quant("gguf", torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("device", ["cuda", "cuda:1", "mps", "meta"])
def test_check_quant_refuses_gguf_off_the_cpu(device: str) -> None:
    with pytest.raises(ValueError, match="CPU only") as err:
        check_quant("gguf", torch.device(device), torch.float32)
    assert f"got device {device}" in str(err.value) and "gguf" in str(err.value)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_check_quant_refuses_gguf_without_float32(dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match="float32") as err:
        check_quant("gguf", torch.device("cpu"), dtype)
    assert f"got dtype {dtype}" in str(err.value) and "gguf" in str(err.value)


def test_without_a_home_folder_the_build_goes_to_the_temporary_directory(no_home: Path) -> None:
    """No HOME and no passwd entry: the build folder is the per-user one under the temporary directory, and the
    disk tier's digest cache is off (None), where pathlib raised RuntimeError before."""
    from radixcache.runtime import native
    from radixcache.runtime.kv.tier.digest_cache import digest_cache_dir

    assert native._cache_candidates() == [no_home / f"radixcache-native-{os.getuid()}"]
    assert digest_cache_dir() is None


def test_every_c_file_and_header_beside_the_kernels_is_in_the_build_key() -> None:
    """team_product.h was missing from the hand-written header list: an edit to it alone kept the old build's name,
    so the stale library was loaded. Every .c is compiled and every .h is hashed."""
    from radixcache.runtime.native import HEADERS, SOURCE

    folder = SOURCE.parent
    assert {p.name for p in folder.glob("*.c")} == {p.name for p in SOURCES}
    assert {p.name for p in folder.glob("*.h")} == {p.name for p in HEADERS}
