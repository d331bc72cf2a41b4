"""Reads from the disk tier's page store (radixcache.runtime.kv.tier.disk_store), and the checks each read makes.

Covers the round trip, prefix counts, misses, every check a read makes (a byte flipped anywhere, a truncated file,
a byte appended, a valid file under another hash's name, the page's own tokens): a page that fails one is a miss
and is deleted. Each through both reads: `read` (the whole file) and `read_into` (the payload straight into the
caller's buffers, as the prefetch readers read: tests.runtime.disk_split). `verify` makes the same checks over
every page.
"""

from __future__ import annotations

import logging
import struct
import tracemalloc
from pathlib import Path

import pytest

from radixcache.runtime.kv.tier.disk_store import MARKER_NAME, DiskStore
from tests.runtime.conftest import FP, META, disk_warnings, h, page_path, payload, toks, write
from tests.runtime.disk_split import READS, Read


@pytest.mark.parametrize("read", READS)
def test_a_page_round_trips(read: Read, open_store) -> None:
    store = open_store()
    assert store.enabled
    write(store, 0)
    assert read(store, h(0), toks(0)) == (payload(0), META)
    path = page_path(store, h(0))
    assert path.is_file()
    s = store.stats()
    assert (s.pages, s.bytes, s.writes, s.read_hits, s.dropped_writes) == (1, path.stat().st_size, 1, 1, 0)
    assert s.fingerprints == {FP: 1} and s.fingerprint_bytes == {FP: s.bytes}
    assert (Path(store.directory) / MARKER_NAME).is_file()


def test_count_prefix_stops_at_the_first_gap(open_store) -> None:
    store = open_store()
    write(store, 0, 1, 3)
    assert store.count_prefix([h(0), h(1), h(2), h(3)]) == 2
    assert store.count_prefix([h(0), h(1)]) == 2
    assert store.count_prefix([h(2), h(3)]) == 0
    assert store.count_prefix([h(3)]) == 1
    assert store.count_prefix([]) == 0


@pytest.mark.parametrize("read", READS)
def test_a_missing_page_is_a_miss(read: Read, open_store) -> None:
    store = open_store()
    assert read(store, h(9), toks(9)) is None
    assert store.stats().read_misses == 1


@pytest.mark.parametrize("read", READS)
def test_a_page_deleted_behind_the_store_is_a_miss_not_corruption(read: Read, open_store) -> None:
    store = open_store()
    write(store, 0)
    page_path(store, h(0)).unlink()
    assert read(store, h(0), toks(0)) is None
    s = store.stats()
    assert (s.pages, s.corrupt_pages, s.read_misses) == (0, 0, 1)


@pytest.mark.parametrize("read", READS)
def test_tokens_that_differ_are_a_miss_and_delete_the_page(read: Read, open_store, caplog) -> None:
    store = open_store()
    write(store, 0)
    assert read(store, h(0), [*toks(0)[:3], 999]) is None
    assert not page_path(store, h(0)).exists()
    assert store.count_prefix([h(0)]) == 0
    assert store.stats().corrupt_pages == 1
    assert len(disk_warnings(caplog)) == 1
    assert read(store, h(0), toks(0)) is None  # gone for good
    assert read(store, h(1), toks(1)) is None


def _region_offsets(data: bytes) -> dict[str, int]:
    header_len = struct.unpack_from("<I", data, 44)[0]
    tokens_at = 48 + header_len
    return {
        "magic": 3,
        "checksum": 20,
        "version": 40,
        "header length": 45,
        "header": 48 + header_len // 2,
        "tokens": tokens_at + 5,
        "payload": tokens_at + 16 + 7,
        "last byte": len(data) - 1,
    }


@pytest.mark.parametrize(
    "region", ["magic", "checksum", "version", "header length", "header", "tokens", "payload", "last byte"]
)
@pytest.mark.parametrize("read", READS)
def test_a_byte_flipped_in_each_region_is_detected(read: Read, open_store, region: str, caplog) -> None:
    store = open_store()
    write(store, 0)
    path = page_path(store, h(0))
    data = bytearray(path.read_bytes())
    # the version 2 to 1, whose blake2b checksum fails (one above this radixcache's is a newer format's page, left
    # in place: test_disk_format)
    data[_region_offsets(bytes(data))[region]] ^= 0x03 if region == "version" else 0x01
    path.write_bytes(bytes(data))
    reopened = open_store()
    assert reopened.count_prefix([h(0)]) == 1  # the index lists it: names and stat only
    assert read(reopened, h(0), toks(0)) is None
    assert not path.exists()
    s = reopened.stats()
    assert (s.pages, s.bytes, s.corrupt_pages) == (0, 0, 1)
    assert any("corrupt" in r.getMessage() for r in disk_warnings(caplog))


@pytest.mark.parametrize("read", READS)
def test_every_single_flipped_byte_is_detected(read: Read, open_store) -> None:
    store = open_store()
    write(store, 0, size=24)
    path = page_path(store, h(0))
    original = path.read_bytes()
    logging.getLogger("radixcache.disk").disabled = True  # one warning per position otherwise
    try:
        for at in range(len(original)):
            data = bytearray(original)
            data[at] ^= 0x80
            path.write_bytes(bytes(data))
            reopened = DiskStore(store.directory, max_bytes=1 << 20, fingerprint=FP)
            assert read(reopened, h(0), toks(0), 24) is None, f"byte {at} of {len(original)} flipped went unnoticed"
            if at == 40:  # version 130: a newer format's page, left in place (test_disk_format)
                assert path.exists() and reopened.stats().corrupt_pages == 0
                continue
            assert not path.exists() and reopened.stats().corrupt_pages == 1
    finally:
        logging.getLogger("radixcache.disk").disabled = False
    path.write_bytes(original)
    assert read(DiskStore(store.directory, max_bytes=1 << 20, fingerprint=FP), h(0), toks(0), 24) == (
        payload(0, 24),
        META,
    )


@pytest.mark.parametrize("keep", [0, 10, 40, 47, 48, 60, -1])
@pytest.mark.parametrize("read", READS)
def test_a_truncated_file_is_detected(read: Read, open_store, keep: int) -> None:
    store = open_store()
    write(store, 0)
    path = page_path(store, h(0))
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    reopened = open_store()
    assert read(reopened, h(0), toks(0)) is None
    assert not path.exists() and reopened.stats().corrupt_pages == 1


@pytest.mark.parametrize("read", READS)
def test_a_file_with_a_byte_appended_is_detected(read: Read, open_store) -> None:
    store = open_store()
    write(store, 0)
    path = page_path(store, h(0))
    path.write_bytes(path.read_bytes() + b"\0")
    reopened = open_store()
    assert read(reopened, h(0), toks(0)) is None
    assert reopened.stats().corrupt_pages == 1


@pytest.mark.parametrize("read", READS)
def test_a_sound_file_under_another_hash_is_rejected(read: Read, open_store) -> None:
    """The checksum holds, but the file records another hash than its name: a hash is never trusted alone."""
    store = open_store()
    write(store, 0)
    other = page_path(store, h(1))
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_bytes(page_path(store, h(0)).read_bytes())
    reopened = open_store()
    assert reopened.count_prefix([h(1)]) == 1
    assert read(reopened, h(1), toks(0)) is None
    assert not other.exists() and reopened.stats().corrupt_pages == 1
    assert read(reopened, h(0), toks(0)) == (payload(0), META)


def test_verify_reports_and_deletes_corrupt_pages(open_store) -> None:
    store = open_store()
    write(store, 0, 1, 2)
    flipped = page_path(store, h(1))
    data = bytearray(flipped.read_bytes())
    data[-3] ^= 0xFF
    flipped.write_bytes(bytes(data))
    misnamed = page_path(store, h(7))
    misnamed.parent.mkdir(parents=True, exist_ok=True)
    misnamed.write_bytes(page_path(store, h(2)).read_bytes())

    kept = store.verify(delete=False)
    assert (kept.checked, kept.ok, kept.removed) == (4, 2, 0)
    assert sorted(kept.corrupt) == sorted([str(flipped), str(misnamed)])
    assert flipped.exists() and misnamed.exists()

    report = store.verify()
    assert (report.checked, report.ok, report.removed, len(report.corrupt)) == (4, 2, 2, 2)
    assert not flipped.exists() and not misnamed.exists()
    assert store.count_prefix([h(1)]) == 0 and store.count_prefix([h(0)]) == 1
    again = store.verify()
    assert (again.checked, again.ok, again.corrupt) == (2, 2, ())


def test_verify_checks_a_huge_file_named_like_a_page_in_bounded_memory(open_store) -> None:
    """verify read each file whole: a huge file named like a page took its size in memory."""
    store = open_store()
    write(store, 0)
    huge = page_path(store, h(7))
    huge.parent.mkdir(parents=True, exist_ok=True)
    with huge.open("wb") as f:
        f.write(page_path(store, h(0)).read_bytes()[:48])
        f.truncate(64 << 20)  # sparse: 64 MiB of zeros after a page's start
    tracemalloc.start()
    try:
        report = store.verify(delete=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (report.checked, report.ok, report.corrupt) == (2, 1, (str(huge),))
    assert report.reasons == ("checksum mismatch",)
    assert peak < 8 << 20
