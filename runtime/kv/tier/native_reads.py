"""The prefetch readers' page reads through the native library (runtime/native/page_reads.c) where it builds: one
call per page that reads the file and hashes its body, without the GIL, in place of Python's open, fstat, preadv,
close and checksum, each of which gives the GIL up and takes it back (or holds it: the checksum). Two reader threads
handing the GIL to each other at each of those spent half their time waiting to run: in scheduler statistics of a
restart's disk hit on this 2-vCPU VM, about 4 ms of 9 each, since every hand-over wakes the other thread's vCPU.

The checksum is XXH3-128 (kv.tier.disk_format) through the streaming functions of the xxhash library that the
`xxhash` package ships, found in its extension module and checked against `xxhash.xxh3_128` before use; where they
are missing or disagree, the read hashes nothing and the checksum is computed in Python as before.

`split_reader()` returns what DiskStore.read_into calls to read a page file: `read_nofollow_split`'s contract
(kv.tier.disk_files), natively for rows laid out at one stride (`StridedRows`, as kv.tier.staging hands them out),
else in Python. It loads the library a float32 CPU model already loaded; where none did (a CUDA model), the first
engine with a disk tier builds it (once per machine: the build is cached, runtime.native). Imports torch (through the
native library's loader); nothing of the KV manager.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import weakref
from collections.abc import Sequence
from typing import NamedTuple

import xxhash

from radixcache.runtime.kv.tier.disk_files import SplitRead, read_nofollow_split


class StridedRows(list):
    """Byte rows (memoryviews) of `row_bytes` each, the first at address `address` and each next one `stride`
    bytes further: what the native read fills in one call."""

    def __init__(self, rows: Sequence[memoryview], address: int, row_bytes: int, stride: int) -> None:
        super().__init__(rows)
        self.address, self.row_bytes, self.stride = address, row_bytes, stride


class _Hash128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]  # xxhash's XXH128_hash_t


class Xxh3(NamedTuple):
    """xxhash's XXH3-128 streaming functions: create and free a state (ctypes functions), and the addresses of
    reset, update and digest that the native read calls."""

    create: ctypes._CFuncPtr  # type: ignore[name-defined]
    free: ctypes._CFuncPtr  # type: ignore[name-defined]
    reset: int
    update: int
    digest: int


def xxh3_functions() -> Xxh3 | None:
    """The `xxhash` package's XXH3-128 streaming functions, when its extension module exports them and they hash
    as `xxhash.xxh3_128` does (checked here on a few inputs); else None."""
    try:
        lib = ctypes.CDLL(xxhash._xxhash.__file__)  # type: ignore[attr-defined]
        create, free = lib.XXH3_createState, lib.XXH3_freeState
        reset, update, digest = lib.XXH3_128bits_reset, lib.XXH3_128bits_update, lib.XXH3_128bits_digest
    except (AttributeError, OSError):
        return None
    create.restype, free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    reset.argtypes, reset.restype = [ctypes.c_void_p], ctypes.c_int
    update.argtypes, update.restype = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int
    digest.argtypes, digest.restype = [ctypes.c_void_p], _Hash128
    state = create()
    if not state:
        return None
    try:
        for parts in ([b""], [b"page"], [os.urandom(300), os.urandom(5000), b"x"]):
            reset(state)
            for part in parts:
                update(state, part, len(part))
            h = digest(state)
            if h.high64.to_bytes(8, "big") + h.low64.to_bytes(8, "big") != xxhash.xxh3_128(b"".join(parts)).digest():
                return None
    finally:
        free(state)
    return Xxh3(create, free, *(ctypes.cast(f, ctypes.c_void_p).value or 0 for f in (reset, update, digest)))


def split_reader() -> SplitRead:
    """`read_nofollow_split` through the native library (hashing as it reads where `xxh3_functions` allows), or
    the Python one where the library does not build."""
    from radixcache.runtime.native import NativeBuildError, blockdot

    try:
        native = blockdot().page_read_split
    except NativeBuildError:
        return read_nofollow_split
    xxh3 = xxh3_functions()
    per_thread = threading.local()  # each reader thread's hash state and digest buffer

    def hasher() -> tuple[int | None, ctypes.Array]:
        got = getattr(per_thread, "hasher", None)
        if got is None:
            state = xxh3.create() if xxh3 is not None else None
            got = per_thread.hasher = _Hasher(state, ctypes.create_string_buffer(16))
            if state:
                weakref.finalize(got, xxh3.free, state)  # type: ignore[union-attr]
        return got.state, got.digest

    def read(path: str, head: bytearray, rows: Sequence[memoryview]) -> tuple[memoryview, bytes | None] | None:
        if not isinstance(rows, StridedRows):
            return read_nofollow_split(path, head, rows)
        state, digest = hasher()
        fns = (xxh3.reset, xxh3.update, xxh3.digest) if state and xxh3 is not None else (0, 0, 0)
        payload, size = rows.row_bytes * len(rows), ctypes.c_long(0)
        for _ in range(2):  # a second time with the head grown to the file's
            head_at = ctypes.addressof(ctypes.c_char.from_buffer(head)) if head else 0
            rc = native(os.fsencode(path), head_at, len(head), rows.address, rows.row_bytes, len(rows), rows.stride,
                        ctypes.byref(size), state, *fns, digest)  # fmt: skip
            if rc == 0:
                return memoryview(head)[: size.value - payload], (digest.raw if state else None)
            if rc < 0:
                raise OSError(-rc, os.strerror(-rc), path)
            if size.value < payload:
                return None  # shorter than the rows
            head.extend(bytes(size.value - payload - len(head)))
        raise OSError(errno.EAGAIN, "the file grew while read", path)

    return read


class _Hasher:
    """A reader thread's XXH3 state (freed with the thread's locals) and the buffer its digests land in."""

    def __init__(self, state: int | None, digest: ctypes.Array) -> None:
        self.state, self.digest = state, digest
