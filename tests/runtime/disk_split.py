"""The disk store's reads as one callable, for tests that check every read the same way: `read` (the whole file) and
`read_into` (its payload straight into the caller's buffers, as the prefetch readers read) through each page-file
read it may be given: Python's (kv.tier.disk_files.read_nofollow_split), the native one that also hashes the page
(kv.tier.native_reads), and the native one with the hashing left to Python (xxhash's functions not found)."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence

import pytest

from radixcache.runtime.kv.tier import native_reads
from radixcache.runtime.kv.tier.disk_files import SplitRead, read_nofollow_split
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.native_reads import StridedRows

Read = Callable[..., "tuple[bytes | memoryview, dict] | None"]
SPLITS = ("python", "native", "native, hashed in Python")


@functools.cache  # one reader per kind for the test process (each builds or loads the native library once)
def split_read(kind: str) -> SplitRead:
    """The page-file read of `kind` (one of SPLITS); skips the test where the native library does not build."""
    if kind == "python":
        return read_nofollow_split
    if kind == "native":
        split = native_reads.split_reader()
    else:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(native_reads, "xxh3_functions", lambda: None)
            split = native_reads.split_reader()
    if split is read_nofollow_split:
        pytest.skip("the native library does not build here")
    return split


def split_rows(buffer: bytearray, rows: int) -> StridedRows:
    """`buffer` cut into `rows` equal rows, listed last row first (a negative stride): a read that fills them in
    the listed order writes the payload backwards by rows, so a test that joins them in that order sees whether
    the order held."""
    step = len(buffer) // rows
    view = memoryview(buffer)
    listed = [view[k * step : (k + 1) * step] for k in reversed(range(rows))]
    last = ctypes.addressof(ctypes.c_char.from_buffer(buffer)) + (rows - 1) * step
    return StridedRows(listed, last, step, -step)


def read_split(
    store: DiskStore,
    page_hash: bytes,
    tokens: Sequence[int],
    size: int = 256,
    rows: int = 4,
    head: bytearray | None = None,
    split: str = "python",
) -> tuple[bytes, dict] | None:
    """`store.read_into` of a page of a `size`-byte payload into `rows` rows through the `split` read: (the rows'
    bytes in order, meta)."""
    parts = split_rows(bytearray(b"\xee" * size), rows)
    meta = store.read_into(
        page_hash, tokens, parts, bytearray(b"\xff" * 3) if head is None else head, split_read(split)
    )
    return None if meta is None else (b"".join(bytes(p) for p in parts), meta)


def read_whole(store: DiskStore, page_hash: bytes, tokens: Sequence[int], size: int = 256) -> tuple | None:
    return store.read(page_hash, tokens)


READS = [pytest.param(read_whole, id="read")] + [
    pytest.param(functools.partial(read_split, split=kind), id=f"read_into, {kind}") for kind in SPLITS
]
