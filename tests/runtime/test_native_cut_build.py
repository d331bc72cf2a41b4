"""A cached build of the native kernels cut short (a machine that crashed before the build's bytes reached the disk,
a cache copied in part) was loaded as it was: dlopen mapped its segments past the file's end and the process died of
SIGBUS at every start until the file was deleted. It is now found from its ELF headers (runtime.native.elf_check)
and built again in its place; where the folder cannot be written the error names it. Each load runs in a process
of its own (the loader is memoised per process, and the crash it guards against would take the test run with it),
forked from `native_probes` (tests/runtime/native_probes.py).
The whole build is the run's first build (`native_build`, tests/runtime/conftest.py), and the builds again go
through `copying_cc`, a stand-in compiler that writes it: the loader's path is the same, without a compile each.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from radixcache.runtime.native.elf_check import elf_intact
from tests.runtime.conftest import NativeBuild
from tests.runtime.native_probes import ProbeServer, probe_environment

pytestmark = [
    pytest.mark.slow,  # four probe processes
    pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler here"),
    pytest.mark.xdist_group("native_builds"),  # with test_native_build: one first build per run (conftest.py)
]

PROBE = """
import json
from radixcache.runtime.native import NativeBuildError, blockdot
try:
    print(json.dumps({"path": blockdot()._name}))
except NativeBuildError as exc:
    print(json.dumps({"error": str(exc)}))
"""
# os.access stubbed to deny writes (root may write whatever a folder's mode says)
DENY = "import os; _a = os.access; os.access = lambda p, m, **k: False if m & os.W_OK else _a(p, m, **k)\n"


def load(
    probes: ProbeServer, cache: Path, prelude: str = "", cc: str | None = None
) -> tuple[int, dict[str, str] | None]:
    """The exit status and the JSON line of PROBE run with `cache` as the native cache folder (and `cc` as CC), in
    a process of its own forked from `probes`."""
    got = probes.run(prelude + PROBE, probe_environment(cache, **({} if cc is None else {"CC": cc})))
    lines = got.stdout.strip().splitlines()
    return got.returncode, json.loads(lines[-1]) if lines else None


@pytest.fixture(scope="module")
def build(native_build: NativeBuild) -> tuple[Path, bytes]:
    """A whole build in a cache folder of its own (the run's first build: read, never changed), and its bytes."""
    return native_build.path, native_build.path.read_bytes()


def test_a_whole_build_is_intact_and_every_cut_is_not(build: tuple[Path, bytes], tmp_path: Path) -> None:
    path, data = build
    assert elf_intact(path)
    cut = tmp_path / "cut.so"
    for size in (0, 1, 3, 4, 40, 63, 64, 1000, len(data) // 10, len(data) // 2, len(data) - 4096, len(data) - 1):
        cut.write_bytes(data[:size])
        assert not elf_intact(cut), size
    cut.write_bytes(b"#!/bin/sh\n")  # not ELF at all: the loader's own error says so
    assert elf_intact(cut)


@pytest.mark.parametrize("share", [0.0, 0.6])
def test_a_build_cut_short_is_built_again_not_a_crash(
    build: tuple[Path, bytes], copying_cc: str, native_probes: ProbeServer, tmp_path: Path, share: float
) -> None:
    path, data = build
    cache = tmp_path / "native"
    cache.mkdir()
    cut = cache / path.name
    cut.write_bytes(data[: int(len(data) * share)])
    rc, got = load(native_probes, cache, cc=copying_cc)
    assert rc == 0, f"the process died with status {rc}"  # -7: SIGBUS in dlopen
    assert got == {"path": str(cut)}, got
    assert elf_intact(cut) and cut.stat().st_size == len(data)


def test_a_build_cut_short_in_a_folder_that_cannot_be_written_is_named(
    build: tuple[Path, bytes], native_probes: ProbeServer, tmp_path: Path
) -> None:
    path, data = build
    cache = tmp_path / "native"
    cache.mkdir()
    cut = cache / path.name
    cut.write_bytes(data[: len(data) // 2])
    rc, got = load(native_probes, cache, DENY)
    assert rc == 0, f"the process died with status {rc}"
    assert got is not None and f"{cut} is cut short: delete it" in got.get("error", ""), got
