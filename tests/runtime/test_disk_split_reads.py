"""`DiskStore.read_into`, the read the prefetch readers use: a page file's payload straight into the caller's buffers
in one vectored read, the rest of the file into a header buffer the caller reuses, through Python's read or the
native one (tests.runtime.disk_split's SPLITS). What only this read has: the header buffer reused and grown, a sound
page of another length refused without being deleted, more buffers than one call takes, a file missing, a folder
or a symlink in a page's place; and for Python's read, short reads, no `preadv` at all and a file that ends while
read. The checks every read makes are in test_disk_reads (each test runs every read)."""

from __future__ import annotations

import ctypes
import os

import pytest
import xxhash

from radixcache.runtime.kv.tier import disk_files, native_reads
from tests.runtime.conftest import META, h, page_path, payload, toks, write
from tests.runtime.disk_split import READS, SPLITS, Read, read_split, split_read, split_rows


@pytest.mark.parametrize("split", SPLITS)
def test_one_header_buffer_serves_every_read_and_grows_once(open_store, split: str) -> None:
    store = open_store()
    write(store, 0, 1, 2)
    head = bytearray(b"\xff" * 7)  # too small, and not zeros
    for i in (0, 1, 2, 1):
        assert read_split(store, h(i), toks(i), head=head, split=split) == (payload(i), META)
    size = len(head)
    assert size >= page_path(store, h(0)).stat().st_size - 256  # grown once to the header's size, then reused
    assert read_split(store, h(0), toks(1), head=head, split=split) is None  # tokens checked, the page deleted
    assert not page_path(store, h(0)).exists() and store.stats().corrupt_pages == 1
    assert read_split(store, h(9), toks(9), head=head, split=split) is None and len(head) == size
    assert read_split(store, h(2), toks(2), head=head, split=split) == (payload(2), META)


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("size", [128, 252, 260, 512, 4096])
def test_a_sound_page_of_another_length_is_refused_and_kept(open_store, size: int, split: str) -> None:
    """Shorter rows put payload bytes into the header part, longer ones header bytes into the rows (or are longer
    than the file): the checksum holds either way, the layout does not."""
    store = open_store()
    write(store, 0)
    assert read_split(store, h(0), toks(0), size=size, split=split) is None
    s = store.stats()
    assert (s.pages, s.corrupt_pages, s.read_misses, s.read_hits) == (1, 0, 1, 0)
    assert page_path(store, h(0)).exists()
    assert read_split(store, h(0), toks(0), split=split) == (payload(0), META)


@pytest.mark.parametrize("split", SPLITS)
def test_more_rows_than_one_call_takes(open_store, split: str) -> None:
    store = open_store()
    n = 2 * disk_files._IOV_MAX + 6  # the native read takes 128 a call
    write(store, 3, size=n)
    assert read_split(store, h(3), toks(3), size=n, rows=n, split=split) == (payload(3, n), META)


@pytest.mark.parametrize("split", SPLITS)
def test_what_is_not_a_readable_page_file_is_a_miss_and_never_followed(open_store, tmp_path, split: str) -> None:
    """A page deleted behind the store (dropped from the index), a folder or a symlink in its place (never
    followed, even to a sound page file): misses, none of them corruption, and nothing deleted but the index entry
    of the missing one."""
    store = open_store()
    write(store, 0, 1, 2)
    page_path(store, h(0)).unlink()
    folder = page_path(store, h(1))
    folder.unlink()
    folder.mkdir()
    link = page_path(store, h(2))
    target = tmp_path / "elsewhere.kvpage"
    target.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(target)
    for i in (0, 1, 2):
        assert read_split(store, h(i), toks(i), split=split) is None
    s = store.stats()
    assert (s.pages, s.corrupt_pages, s.read_misses, s.read_hits) == (2, 0, 3, 0)
    assert folder.is_dir() and link.is_symlink() and target.exists()


def _preadv_at_most(limit: int):
    """A `preadv` that reads at most `limit` bytes a call (as a read interrupted by a signal may)."""
    calls = []

    def preadv(fd: int, views: list[memoryview], offset: int) -> int:
        calls.append(len(views))
        data = os.pread(fd, min(limit, sum(len(v) for v in views)), offset)
        at = 0
        for v in views:
            n = min(len(v), len(data) - at)
            v[:n] = data[at : at + n]
            at += n
        return len(data)

    return preadv, calls


@pytest.mark.parametrize("limit", [1, 7, 100, 255])
def test_short_reads_continue_where_they_stopped(open_store, monkeypatch, limit: int) -> None:
    store = open_store()
    write(store, 0, 1)
    preadv, calls = _preadv_at_most(limit)
    monkeypatch.setattr(disk_files, "_PREADV", preadv)
    assert read_split(store, h(0), toks(0), rows=8) == (payload(0), META)
    assert len(calls) >= page_path(store, h(0)).stat().st_size // limit
    assert read_split(store, h(1), toks(1), rows=1) == (payload(1), META)


def test_without_preadv_each_buffer_is_read_in_turn(open_store, monkeypatch) -> None:
    store = open_store()
    write(store, 0, 1)
    monkeypatch.setattr(disk_files, "_PREADV", None)
    assert read_split(store, h(0), toks(0), rows=16) == (payload(0), META)
    path = page_path(store, h(1))
    data = bytearray(path.read_bytes())
    data[-5] ^= 1  # in the payload: its checksum is still checked
    path.write_bytes(bytes(data))
    assert read_split(store, h(1), toks(1)) is None and store.stats().corrupt_pages == 1


def test_a_file_that_ends_while_read_is_a_miss_not_corruption(open_store, monkeypatch) -> None:
    store = open_store()
    write(store, 0)
    real, calls = _preadv_at_most(100)
    monkeypatch.setattr(disk_files, "_PREADV", lambda fd, views, offset: real(fd, views, offset) if not calls else 0)
    assert read_split(store, h(0), toks(0)) is None
    s = store.stats()
    assert (s.pages, s.corrupt_pages, s.read_misses) == (1, 0, 1)
    monkeypatch.undo()
    assert read_split(store, h(0), toks(0)) == (payload(0), META)


def test_split_rows_lists_the_buffer_backwards_one_stride_apart() -> None:
    buf = bytearray(range(8))
    rows = split_rows(buf, 4)
    assert [bytes(r) for r in rows] == [b"\x06\x07", b"\x04\x05", b"\x02\x03", b"\x00\x01"]
    assert (rows.row_bytes, rows.stride) == (2, -2)
    assert rows.address == ctypes.addressof(ctypes.c_char.from_buffer(buf)) + 6


def test_the_native_read_hashes_the_page_body_as_xxhash_does(open_store) -> None:
    split = split_read("native")
    store = open_store()
    write(store, 0, size=5000)
    data = page_path(store, h(0)).read_bytes()
    rows = split_rows(bytearray(5000), 10)
    got = split(str(page_path(store, h(0))), bytearray(), rows)
    assert got is not None
    head, digest = got
    assert bytes(head) == data[:-5000] and b"".join(bytes(r) for r in rows) == data[-5000:]
    if native_reads.xxh3_functions() is None:
        assert digest is None  # the checksum is then computed in Python
    else:
        assert digest == xxhash.xxh3_128(data[40:]).digest()


def test_xxhash_functions_that_are_missing_leave_the_hashing_to_python(monkeypatch) -> None:
    class Bare:  # an extension module that exports none of the streaming functions
        def __init__(self, path: str) -> None:
            pass

    monkeypatch.setattr(native_reads.ctypes, "CDLL", Bare)
    assert native_reads.xxh3_functions() is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("read", READS)
def test_a_fifo_in_a_pages_place_is_a_miss_and_never_waited_on(open_store, read: Read) -> None:
    """Opening a FIFO for reading waits for a writer; a page read opens without waiting and refuses it."""
    store = open_store()
    write(store, 0)
    path = page_path(store, h(0))
    path.unlink()
    os.mkfifo(path)
    assert read(store, h(0), toks(0)) is None
    s = store.stats()
    assert (s.pages, s.corrupt_pages, s.read_misses) == (1, 0, 1)
    assert path.exists()
