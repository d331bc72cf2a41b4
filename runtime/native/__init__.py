"""Native kernels, built on first use with the machine's C compiler and loaded with ctypes.

`blockdot.c` multiplies float32 activations by weights kept in GGUF's blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
Q5_K, Q6_K; runtime.model.block_linear); `qdot.c` does the same products with the activations quantised to int8 or
16 bits per 32 values (integer dot products: AVX-512 VNNI, AVX-VNNI, AVX2 or portable C); `ggml_blocks.h` holds
the block layouts both read. `densedot.c` runs the same call on plain float32 rows (the float32 model's decode
products); `page_reads.c` reads a disk-tier page file in one call, without the GIL (runtime.kv.tier.native_reads).
They are compiled together, once per source, compiler and CPU into a cache folder (`$RADIXCACHE_NATIVE_CACHE`,
else `~/.cache/radixcache/native`, else a per-user temporary folder) with `-O3 -march=native -fopenmp
-ffp-contract=off`, and reused.
The compiler is `$CC` (a command line: "ccache gcc" works), else `cc`. OpenMP: torch is imported first, so the
library binds to the libgomp torch loaded (one thread pool, sized by `torch.set_num_threads` on the calling
thread), not to a second copy.

Nothing here runs unless a caller asks for the kernels. A machine without a compiler loses `quant="gguf"` (with an
error that says what is missing); a float32 model and the disk tier's reads then run without them.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch  # noqa: F401  (loaded first on purpose: its libgomp is the one the library binds to)

from radixcache.runtime import atomic_file
from radixcache.runtime.native.elf_check import elf_intact

SOURCE = Path(__file__).with_name("blockdot.c")
SOURCES = tuple(
    SOURCE.with_name(n)
    for n in (
        "blockdot.c",
        "qdot.c",
        "densedot.c",
        "decode_attention.c",
        "paged_attention.c",
        "decode_store.c",
        "decode_layers.c",
        "decode_team.c",
        "team_pool.c",
        "row_argmax.c",
        "page_reads.c",
        "mirror_fill.c",
    )
)
# Every header beside the sources: each one is part of the build key, so an edit to any of them rebuilds (a list
# written by hand had left team_product.h out, and an edit to it alone reused the stale build).
HEADERS = tuple(sorted(SOURCE.parent.glob("*.h")))
# -ffp-contract=off: a product and a sum stay two roundings, never one fused multiply-add the compiler chose, so
# kernels that spell the same arithmetic differently (decode_attention.c's vector span and its scalar loops,
# decode_store.c against PyTorch) keep the same bits on any compiler (GCC in ISO C mode already does this; clang
# fuses within an expression unless told not to).
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off")
LIBS = ("-lm",)  # after the source: linkers drop a library named before the objects that need it


class NativeBuildError(ValueError):
    """The native kernels cannot be built or loaded on this machine (the message says why)."""


@functools.lru_cache(maxsize=1)  # one library per process: memoised, never mutated
def blockdot() -> ctypes.CDLL:
    """The loaded block-matmul library, built first if this machine has no build of the current source."""
    compiler = _compiler()
    if shutil.which(compiler[0]) is None:
        raise NativeBuildError(
            f"quant='gguf' builds a C kernel on first use and needs a C compiler: {compiler[0]!r} was not found"
            " (set CC)"
        )
    name = f"blockdot-{_build_key(compiler)}.so"
    cut: list[Path] = []
    for folder in _cache_candidates():
        path = folder / name
        whole = path.is_file() and elf_intact(path)  # a build cut short is a SIGBUS in dlopen (native.elf_check)
        if whole:  # reused even where the folder cannot be written (a read-only prebuilt cache)
            return load_library(path)
        if path.is_file():
            cut.append(path)
        if _writable(folder):  # no build yet, or one cut short: built (again) in its place
            _build(compiler, path)
            tidy_cache(folder, keep=path.name)
            return load_library(path)
    tried = ", ".join(map(str, _cache_candidates()))
    damaged = f" ({', '.join(map(str, cut))} is cut short: delete it)" if cut else ""
    raise NativeBuildError(f"no writable folder for the native kernel's build: tried {tried}{damaged}")


def load_library(path: str | os.PathLike[str]) -> ctypes.CDLL:
    """A build of the kernels at `path` loaded, with every function's signature declared (what `blockdot()` returns
    for the current sources; scripts/bench_native_ab.py loads another revision's build beside it)."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeBuildError(f"cannot load the native kernel {path}: {exc}") from exc
    ptr, num = ctypes.c_void_p, ctypes.c_int
    # (parts, part data pointers, part kinds, part rows, cols, x, tokens, y, row stride of y) -> 0, -1 or -2
    lib.blockdot_matmul.argtypes = [num, ptr, ptr, ptr, num, ptr, num, ptr, num]
    lib.blockdot_matmul.restype = ctypes.c_int
    lib.qdot_matmul.argtypes = lib.blockdot_matmul.argtypes  # the same call with int8 activations: 0, -1 or -2
    lib.qdot_matmul.restype = ctypes.c_int
    lib.qdot16_matmul.argtypes = lib.blockdot_matmul.argtypes  # with 16-bit activations: 0, -1 or -2
    lib.qdot16_matmul.restype = ctypes.c_int
    lib.densedot_matmul.argtypes = lib.blockdot_matmul.argtypes  # the same call on float32 rows: 0, or -1
    lib.densedot_matmul.restype = ctypes.c_int
    for name in ("blockdot_max_tokens", "blockdot_max_parts", "blockdot_vector_width", "qdot_path"):
        getattr(lib, name).restype = ctypes.c_int
    # (x, weight, rows, cols, eps, out) -> 0, or -1
    lib.native_rms_norm.argtypes = [ptr, ptr, num, num, ctypes.c_float, ptr]
    lib.native_rms_norm.restype = ctypes.c_int
    # (q, batch, heads, kv heads, head dim, k, v, row stride, head stride, lengths, capacity, out) -> 0, or -1
    lib.native_decode_attention.argtypes = [ptr, num, num, num, num, ptr, ptr, ctypes.c_long, ctypes.c_long, ptr]
    lib.native_decode_attention.argtypes += [num, ptr]
    lib.native_decode_attention.restype = ctypes.c_int
    # (q, queries, heads, kv heads, head dim, k pages, v pages, block stride, position stride, page size, table,
    #  table length, pool blocks, start, out) -> 0, or -1
    lib.native_paged_attention.argtypes = [ptr, num, num, num, num, ptr, ptr, ctypes.c_long, ctypes.c_long, num]
    lib.native_paged_attention.argtypes += [ptr, num, num, num, ptr]
    lib.native_paged_attention.restype = ctypes.c_int
    # (total, shares, threads, chunk, slow thread, its delay in us, counts out, rows taken from others out)
    #  -> the threads that ran, or -1 (thread_rows.h's shares, for tests)
    lib.native_row_shares_check.argtypes = [num, num, num, num, num, num, ptr, ptr]
    lib.native_row_shares_check.restype = ctypes.c_int
    lib.native_row_claims_check.argtypes = [num, num, num, ptr, num]  # (rows, chunk, from back, sizes, cap)
    lib.native_row_claims_check.restype = ctypes.c_int
    # (qkv, rows, heads, kv heads, head dim, positions, cos, signed sin, max position, q out, pool k, pool v, slots,
    #  slot count, mirror k, mirror v, mirror row stride, mirror head stride, mirror rows, mirror positions,
    #  mirror row count, mirror capacity) -> 0, or -1 (decode_store.c)
    long = ctypes.c_long
    lib.native_rope_store.argtypes = [ptr, num, num, num, num, ptr, ptr, ptr, long, ptr, ptr, ptr, ptr, long]
    lib.native_rope_store.argtypes += [ptr, ptr, long, long, ptr, ptr, long, long]
    lib.native_rope_store.restype = ctypes.c_int
    # (gate and up rows, rows, inter, out) -> 0, or -1 (decode_layers.c)
    lib.native_silu_mul.argtypes = [ptr, num, num, ptr]
    lib.native_silu_mul.restype = ctypes.c_int
    # (pool K, pool V, layer stride, layers, blocks, page size, kv heads, head dim, page ids, pages, positions,
    #  K rows, V rows, capacity, threads) -> 0, or -1 (nothing written)
    lib.native_mirror_fill.argtypes = [ptr, ptr, long, num, num, num, num, num, ptr, num, num, ptr, ptr, num, num]
    lib.native_mirror_fill.restype = ctypes.c_int
    # (layers, layer count, x, rows, hidden, heads, kv heads, head dim, inter, eps, positions, cos, signed sin, max
    #  position, pool, pool layer stride, pool v offset, slots, slot count, mirror k per layer, mirror v per layer,
    #  mirror row stride, mirror head stride, mirror rows, mirror positions, mirror row count, mirror capacity,
    #  lengths, mirror order, its inverse, team: decode_team.c's seats, 0 for OpenMP's count) -> 0, -1 or -2
    #  (decode_layers.c). An older revision's build (bench_native_ab.py) takes no team: the extra argument is ignored.
    layers = [ptr, num, ptr, num, num, num, num, num, num, ctypes.c_float, ptr, ptr, ptr]
    layers += [long, ptr, long, long, ptr, long, ptr, ptr, long, long, ptr, ptr, long, long, ptr, ptr, ptr]
    lib.native_decode_layers.argtypes = [*layers, num]
    lib.native_decode_layers.restype = ctypes.c_int
    if hasattr(lib, "native_decode_step"):  # an older revision's build (bench_native_ab.py) has neither
        # the layers' arguments but the team, then (final norm, head, logits, greedy tokens, team): the layers and the
        # head in one call
        lib.native_decode_step.argtypes = [*layers, ptr, ptr, ptr, ptr, num]
        lib.native_decode_step.restype = ctypes.c_int
        # the same, always without barriers, a thread stalled after each claim (tests): + (thread, us, claims taken)
        lib.native_decode_step_stalled.argtypes = [*lib.native_decode_step.argtypes, num, num, ptr]
        lib.native_decode_step_stalled.restype = ctypes.c_int
        lib.native_decode_step_barriers.argtypes = lib.native_decode_step.argtypes  # always with barriers (tests)
        lib.native_decode_step_barriers.restype = ctypes.c_int
    if hasattr(lib, "native_team_quiesce"):  # () -> 0, once no helper of a decode team is inside a step (team_pool.c)
        lib.native_team_quiesce.argtypes = []
        lib.native_team_quiesce.restype = ctypes.c_int
    # (x, rows, hidden, eps, final norm weight, head (decode_layers.c native_linear), logits out, greedy tokens out)
    #  -> 0, -1 or -2 (decode_layers.c)
    lib.native_decode_head.argtypes = [ptr, num, num, ctypes.c_float, ptr, ptr, ptr, ptr]
    lib.native_decode_head.restype = ctypes.c_int
    # (logits, rows, columns, greedy tokens out) -> 0, or -1 (row_argmax.c)
    lib.native_row_argmax.argtypes = [ptr, num, long, ptr]
    lib.native_row_argmax.restype = ctypes.c_int
    # (path, head, head capacity, rows, row bytes, rows, row stride, size out, hasher state, its reset, update and
    #  digest functions, digest out) -> 0, 1 or -errno (page_reads.c)
    lib.page_read_split.argtypes = [ctypes.c_char_p, ptr, long, ptr, long, num, long, ptr, ptr, ptr, ptr, ptr, ptr]
    lib.page_read_split.restype = ctypes.c_int
    return lib


def _cache_candidates() -> list[Path]:
    """`$RADIXCACHE_NATIVE_CACHE`, else `~/.cache/radixcache/native`, then (where the home folder holds no build
    and cannot be written: a read-only or missing home) a per-user folder under the system's temporary directory."""
    explicit = os.environ.get("RADIXCACHE_NATIVE_CACHE")
    if explicit:
        return [Path(explicit)]
    try:
        home = [Path.home() / ".cache" / "radixcache" / "native"]
    except RuntimeError:  # no home at all (HOME unset, no passwd entry): pathlib cannot name one
        home = []
    return [*home, Path(tempfile.gettempdir()) / f"radixcache-native-{os.getuid()}"]


def _writable(folder: Path) -> bool:
    """Whether a build can be written into `folder` (created if missing)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


@functools.lru_cache(maxsize=1)  # the sources do not change under a running process
def source_digest() -> str:
    """A digest of the kernels' C sources: what a measurement of them (a kernel plan) was made with."""
    h = hashlib.sha256()
    for path in SOURCES + HEADERS:
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _compiler() -> list[str]:
    """`$CC` split as a shell splits it (a wrapper or flags may come with the compiler, as make and setuptools take
    it), else `cc` (also for an empty CC)."""
    try:
        return shlex.split(os.environ.get("CC", "")) or ["cc"]
    except ValueError as exc:  # unbalanced quotes
        raise NativeBuildError(f"$CC={os.environ['CC']!r} is not a command line: {exc}") from exc


def _build_key(compiler: list[str]) -> str:
    """Source, flags, compiler version and CPU flags: a build for another CPU (-march=native) is never reused."""
    h = hashlib.sha256()
    for path in SOURCES + HEADERS:
        h.update(path.read_bytes())
    h.update(" ".join(FLAGS + LIBS).encode())
    version = subprocess.run([*compiler, "--version"], capture_output=True, text=True, check=False).stdout
    h.update(version.encode())
    h.update(platform.machine().encode())
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
        h.update(flags.encode())
    except (OSError, StopIteration):
        h.update(platform.processor().encode())
    return h.hexdigest()[:16]


def _umask() -> int:
    """The process's umask, read without setting it (os.umask sets it: racy with threads creating files meanwhile);
    022 where /proc does not say."""
    with contextlib.suppress(OSError, StopIteration, ValueError):
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("Umask:"))
        return int(line.split()[1], 8)
    return 0o022


def _build(compiler: list[str], path: Path) -> None:
    """Compile into a staging file beside `path` and move it there whole (radixcache.runtime.atomic_file: synced to
    disk before it takes its name, then its folder; concurrent builds cannot clash, and a killed build's staging
    file goes with the next build of `path`)."""
    with atomic_file.staged(path) as tmp:
        cmd = [*compiler, *FLAGS, *map(str, SOURCES), "-o", tmp, *LIBS]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            names = " and ".join(p.name for p in SOURCES)
            raise NativeBuildError(
                f"building {names} with {shlex.join(compiler)} failed (exit {proc.returncode}):\n{tail}"
            )
        # the linker keeps or adds to the mode of the file it is given: give the build the mode a plain `cc -o`
        # would, so that a cache shared between users (or a prebuilt one copied elsewhere) can be read. An earlier
        # file at `path` (a build cut short) gives its own.
        os.chmod(tmp, 0o755 & ~_umask())


BUILDS_KEPT = 8  # builds of other sources, compilers or CPUs kept beside the current one (another checkout's)
STALE_TEMP_SECONDS = 3600.0  # a temporary build this old was left by a killed build: no compile takes an hour


def tidy_cache(folder: Path, keep: str, now: float | None = None) -> list[Path]:
    """Remove what the build cache `folder` no longer needs, and return what was removed: temporary files of builds
    killed mid-compile (older than STALE_TEMP_SECONDS: a younger one may be a concurrent build's), and all but the
    BUILDS_KEPT newest other builds (each source change leaves one behind). `keep`, the build just made, stays.
    A build removed while another process has it loaded stays mapped in that process; a later process rebuilds it."""
    now = time.time() if now is None else now
    removed: list[Path] = []
    builds: list[tuple[float, Path]] = []
    for entry in folder.iterdir():
        try:
            mtime = entry.stat().st_mtime
        except OSError:  # removed meanwhile by another process's tidy
            continue
        temporary = entry.name.startswith(".blockdot-") and entry.name.endswith(atomic_file.PARTIAL)
        temporary = temporary or (entry.name.startswith("tmp") and entry.suffix == ".so")  # an older version's
        if temporary and now - mtime > STALE_TEMP_SECONDS:
            removed.append(entry)
        elif entry.name.startswith("blockdot-") and entry.suffix == ".so" and entry.name != keep:
            builds.append((mtime, entry))
    builds.sort(reverse=True)
    removed += [entry for _, entry in builds[BUILDS_KEPT:]]
    for entry in removed:
        with contextlib.suppress(OSError):
            entry.unlink()
    return removed
