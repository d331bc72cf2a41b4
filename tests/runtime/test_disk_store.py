"""The disk tier's page store (radixcache.runtime.kv.tier.disk_store): real files under tmp_path, no filesystem mocks.

Covers the round trip, prefix counts, every check a read makes (a byte flipped anywhere, a truncated file, a valid
file under another hash's name, the page's own tokens), leftovers of a killed writer, the index rebuilt on reopen,
the LRU size limit (and its order across a restart), write failures that disable the store without raising, the
bounded queue and a `put` that never blocks, threads racing, verify and clear.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import struct
import threading
import time
from pathlib import Path

import pytest

from radixcache.runtime.kv.tier.disk_format import MAGIC
from radixcache.runtime.kv.tier.disk_store import MARKER_NAME, DiskStore, fingerprint_tag

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


# ------------------------------------------------------------------------------------------------ round trip


def test_a_page_round_trips(open_store) -> None:
    store = open_store()
    assert store.enabled
    write(store, 0)
    assert store.read(h(0), toks(0)) == (payload(0), META)
    path = page_path(store, h(0))
    assert path.is_file()
    s = store.stats()
    assert (s.pages, s.bytes, s.writes, s.read_hits, s.dropped_writes) == (1, path.stat().st_size, 1, 1, 0)
    assert s.fingerprints == {FP: 1} and s.fingerprint_bytes == {FP: s.bytes}
    assert (Path(store.directory) / MARKER_NAME).is_file()


def test_the_file_format_is_the_documented_one(open_store) -> None:
    store = open_store()
    write(store, 5)
    data = page_path(store, h(5)).read_bytes()
    assert data[:8] == MAGIC
    assert data[8:40] == hashlib.blake2b(data[40:], digest_size=32).digest()
    version, header_len = struct.unpack_from("<II", data, 40)
    header = json.loads(data[48 : 48 + header_len])
    assert version == 1
    assert header == {
        "hash": h(5).hex(),
        "fingerprint": FP,
        "tokens": 4,
        "token_width": 4,
        "payload": 256,
        "meta": META,
    }
    tokens_at = 48 + header_len
    assert list(struct.unpack_from("<4i", data, tokens_at)) == toks(5)
    assert data[tokens_at + 16 :] == payload(5)


def test_token_ids_beyond_int32_are_stored_as_int64(open_store) -> None:
    store = open_store()
    big = [2**40, 1, 2**62, -3]
    assert store.put(h(1), big, b"kv", META)
    assert store.flush(10)
    assert store.read(h(1), big) == (b"kv", META)
    assert store.read(h(1), [1, 1, 1, 1]) is None  # the tokens differ: deleted


def test_count_prefix_stops_at_the_first_gap(open_store) -> None:
    store = open_store()
    write(store, 0, 1, 3)
    assert store.count_prefix([h(0), h(1), h(2), h(3)]) == 2
    assert store.count_prefix([h(0), h(1)]) == 2
    assert store.count_prefix([h(2), h(3)]) == 0
    assert store.count_prefix([h(3)]) == 1
    assert store.count_prefix([]) == 0


def test_a_missing_page_is_a_miss(open_store) -> None:
    store = open_store()
    assert store.read(h(9), toks(9)) is None
    assert store.stats().read_misses == 1


def test_a_page_deleted_behind_the_store_is_a_miss_not_corruption(open_store) -> None:
    store = open_store()
    write(store, 0)
    page_path(store, h(0)).unlink()
    assert store.read(h(0), toks(0)) is None
    s = store.stats()
    assert (s.pages, s.corrupt_pages, s.read_misses) == (0, 0, 1)


def test_bad_arguments_raise_at_put(open_store) -> None:
    store = open_store()
    with pytest.raises(ValueError):
        store.put(b"", toks(0), b"x", META)
    with pytest.raises(ValueError):
        store.put(h(0), [2**63], b"x", META)
    with pytest.raises(TypeError):
        store.put(h(0), toks(0), b"x", {"dtype": object()})
    assert store.stats().pending_writes == 0


# ------------------------------------------------------------------------------------------------ checks on read


def test_tokens_that_differ_are_a_miss_and_delete_the_page(open_store, caplog) -> None:
    store = open_store()
    write(store, 0)
    assert store.read(h(0), [*toks(0)[:3], 999]) is None
    assert not page_path(store, h(0)).exists()
    assert store.count_prefix([h(0)]) == 0
    assert store.stats().corrupt_pages == 1
    assert len(disk_warnings(caplog)) == 1
    assert store.read(h(0), toks(0)) is None  # gone for good
    assert store.read(h(1), toks(1)) is None


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
def test_a_byte_flipped_in_each_region_is_detected(open_store, region: str, caplog) -> None:
    store = open_store()
    write(store, 0)
    path = page_path(store, h(0))
    data = bytearray(path.read_bytes())
    data[_region_offsets(bytes(data))[region]] ^= 0x01
    path.write_bytes(bytes(data))
    reopened = open_store()
    assert reopened.count_prefix([h(0)]) == 1  # the index lists it: names and stat only
    assert reopened.read(h(0), toks(0)) is None
    assert not path.exists()
    s = reopened.stats()
    assert (s.pages, s.bytes, s.corrupt_pages) == (0, 0, 1)
    assert any("corrupt" in r.getMessage() for r in disk_warnings(caplog))


def test_every_single_flipped_byte_is_detected(open_store) -> None:
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
            assert reopened.read(h(0), toks(0)) is None, f"byte {at} of {len(original)} flipped went unnoticed"
            assert not path.exists() and reopened.stats().corrupt_pages == 1
    finally:
        logging.getLogger("radixcache.disk").disabled = False
    path.write_bytes(original)
    assert DiskStore(store.directory, max_bytes=1 << 20, fingerprint=FP).read(h(0), toks(0)) == (payload(0, 24), META)


@pytest.mark.parametrize("keep", [0, 10, 40, 47, 48, 60, -1])
def test_a_truncated_file_is_detected(open_store, keep: int) -> None:
    store = open_store()
    write(store, 0)
    path = page_path(store, h(0))
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    reopened = open_store()
    assert reopened.read(h(0), toks(0)) is None
    assert not path.exists() and reopened.stats().corrupt_pages == 1


def test_a_file_with_a_byte_appended_is_detected(open_store) -> None:
    store = open_store()
    write(store, 0)
    path = page_path(store, h(0))
    path.write_bytes(path.read_bytes() + b"\0")
    reopened = open_store()
    assert reopened.read(h(0), toks(0)) is None
    assert reopened.stats().corrupt_pages == 1


def test_a_sound_file_under_another_hash_is_rejected(open_store) -> None:
    """The checksum holds, but the file records another hash than its name: a hash is never trusted alone."""
    store = open_store()
    write(store, 0)
    other = page_path(store, h(1))
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_bytes(page_path(store, h(0)).read_bytes())
    reopened = open_store()
    assert reopened.count_prefix([h(1)]) == 1
    assert reopened.read(h(1), toks(0)) is None
    assert not other.exists() and reopened.stats().corrupt_pages == 1
    assert reopened.read(h(0), toks(0)) == (payload(0), META)


# ------------------------------------------------------------------------------------------------ open, reopen


def test_leftover_temporary_files_are_removed_at_open(open_store, tmp_path: Path) -> None:
    store = open_store()
    write(store, 0)
    store.close()
    tmp = Path(store.tmp_dir)
    dead = tmp / f"{2**22 + 1}-0123456789abcdef.tmp"  # above any Linux pid: its writer is gone (kill -9)
    odd = tmp / "garbage.tmp"
    huge = tmp / f"{10**30}-0123456789abcdef.tmp"  # no pid at all
    ours = tmp / f"{os.getpid()}-fedcba9876543210.tmp"  # a live writer's (another store in this process)
    stale = tmp / f"{os.getpid()}-00000000aaaaaaaa.tmp"  # alive, but no write takes an hour
    for f in (dead, odd, huge, ours, stale):
        f.write_bytes(b"half a page")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    reopened = open_store()
    assert not dead.exists() and not odd.exists() and not huge.exists() and not stale.exists()
    assert ours.exists()
    assert reopened.read(h(0), toks(0)) == (payload(0), META)


def test_the_index_is_rebuilt_on_reopen(open_store) -> None:
    store = open_store()
    write(store, 0, 1, 2)
    before = store.stats()
    store.close()
    second = open_store()
    s = second.stats()
    assert (s.pages, s.bytes, s.fingerprints) == (3, before.bytes, {FP: 3})
    assert second.count_prefix([h(0), h(1), h(2), h(3)]) == 3
    for i in range(3):
        assert second.read(h(i), toks(i)) == (payload(i), META)


def test_a_second_store_open_at_the_same_time_sees_the_pages(open_store) -> None:
    first = open_store()
    write(first, 0, 1)
    second = open_store()
    assert second.count_prefix([h(0), h(1)]) == 2
    assert second.read(h(1), toks(1)) == (payload(1), META)


def test_pages_are_counted_per_fingerprint(open_store, tmp_path: Path) -> None:
    a = open_store(fingerprint="model-a")
    b = open_store(fingerprint="model-b")
    write(a, 0, 1)
    write(b, 2)
    both = open_store(fingerprint="model-c")
    s = both.stats()
    assert s.fingerprints == {"model-a": 2, "model-b": 1}
    assert sum(s.fingerprint_bytes.values()) == s.bytes
    assert both.read(h(2), toks(2)) == (payload(2), META)  # readable whatever the fingerprint
    assert Path(a.pages_dir).name == fingerprint_tag("model-a")


def test_a_non_empty_directory_without_the_marker_is_not_adopted(tmp_path: Path, caplog) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("mine")
    store = DiskStore(home, max_bytes=1 << 20)
    assert not store.enabled
    assert not store.put(h(0), toks(0), b"x", META)
    assert sorted(p.name for p in home.iterdir()) == ["notes.txt"]
    assert len(disk_warnings(caplog)) == 1
    with pytest.raises(ValueError, match=str(home)):
        store.clear()
    assert (home / "notes.txt").read_text() == "mine"


def test_another_format_version_is_left_alone(open_store, caplog) -> None:
    store = open_store()
    write(store, 0)
    store.close()
    marker = Path(store.directory) / MARKER_NAME
    marker.write_text(json.dumps({"format": "radixcache-kv-pages", "version": 99}))
    newer = open_store()
    assert not newer.enabled and newer.count_prefix([h(0)]) == 0
    assert newer.read(h(0), toks(0)) is None
    assert page_path(store, h(0)).exists()  # not taken for corrupt
    assert len(disk_warnings(caplog)) == 1


def test_create_false_only_opens_an_existing_cache(tmp_path: Path, open_store) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        DiskStore(tmp_path / "nope", max_bytes=0, create=False)
    assert not (tmp_path / "nope").exists()
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(ValueError, match="not a radixcache cache"):
        DiskStore(plain, max_bytes=0, create=False)
    assert list(plain.iterdir()) == []
    write(open_store(), 0)
    inspect = DiskStore(tmp_path / "cache", max_bytes=0, create=False)
    assert inspect.stats().pages == 1 and not inspect.enabled
    assert inspect.read(h(0), toks(0)) == (payload(0), META)


# ------------------------------------------------------------------------------------------------ size limit


def test_the_size_limit_evicts_the_least_recently_used_and_a_read_refreshes(open_store, tmp_path: Path) -> None:
    probe = open_store(directory=tmp_path / "probe")
    write(probe, 100)
    size = probe.stats().bytes  # every page of this test has the same size
    store = open_store(max_bytes=3 * size)
    write(store, 0, 1, 2)
    assert store.read(h(0), toks(0)) is not None  # 1 is now the least recently used
    write(store, 3)
    s = store.stats()
    assert (s.pages, s.evicted_pages) == (3, 1) and s.bytes <= 3 * size
    assert not page_path(store, h(1)).exists()
    assert store.count_prefix([h(0)]) == 1 and store.count_prefix([h(1)]) == 0
    write(store, 4)  # now 2 goes
    assert not page_path(store, h(2)).exists()
    assert store.count_prefix([h(0), h(3), h(4)]) == 3 and store.count_prefix([h(2), h(3)]) == 0


def test_the_recency_order_survives_a_restart(open_store) -> None:
    store = open_store()
    write(store, 0, 1, 2)
    size = store.stats().bytes // 3
    store.close()
    for i, t in enumerate((1000, 2000, 3000)):
        os.utime(page_path(store, h(i)), (t, t))
    reopened = open_store(max_bytes=3 * size)
    assert reopened.read(h(0), toks(0)) is not None  # refreshes its mtime too
    reopened.close()
    third = open_store(max_bytes=3 * size)
    write(third, 3)
    assert not page_path(store, h(1)).exists()  # the oldest mtime after the read
    assert third.count_prefix([h(0)]) == 1 and third.count_prefix([h(2)]) == 1


def test_a_page_larger_than_max_bytes_is_not_stored(open_store) -> None:
    store = open_store(max_bytes=200)
    assert not store.put(h(0), toks(0), payload(0), META)
    s = store.stats()
    assert (s.pages, s.dropped_writes) == (0, 1)


# ------------------------------------------------------------------------------------------------ the writer


def _stall(store: DiskStore) -> tuple[threading.Event, threading.Event]:
    """Make the writer block before each write until `gate` is set; `started` is set when it first blocks."""
    gate, started = threading.Event(), threading.Event()
    real = store._write_page

    def slow(write):
        started.set()
        assert gate.wait(30)
        return real(write)

    store._write_page = slow  # type: ignore[method-assign]
    return gate, started


def test_put_never_blocks_and_drops_beyond_max_pending(open_store) -> None:
    store = open_store(max_pending=4)
    gate, started = _stall(store)
    assert store.put(h(0), toks(0), payload(0), META)
    assert started.wait(10)  # the writer holds page 0
    t0 = time.perf_counter()
    accepted = [store.put(h(i), toks(i), payload(i), META) for i in range(1, 6)]
    elapsed = time.perf_counter() - t0
    assert accepted == [True, True, True, False, False]
    # A put that waited for the stalled writer would take the stall's 30 s (the gate opens only below): a bound
    # far under that and far over any busy machine's scheduling delay.
    assert elapsed < 10, f"put blocked for {elapsed:.3f}s"
    assert not store.put(h(1), toks(1), payload(1), META)  # already queued
    assert store.flush(timeout=0.05) is False
    assert store.stats().pending_writes == 4
    gate.set()
    assert store.flush(timeout=10)
    s = store.stats()
    assert (s.pages, s.writes, s.dropped_writes, s.pending_writes) == (4, 4, 3, 0)
    assert not store.put(h(1), toks(1), payload(1), META)  # already stored


def test_max_pending_zero_drops_every_write(open_store) -> None:
    store = open_store(max_pending=0)
    assert not store.put(h(0), toks(0), payload(0), META)
    assert store.flush(timeout=1) and store.stats().dropped_writes == 1


def test_close_discards_what_it_could_not_flush_and_later_puts_drop(open_store) -> None:
    store = open_store()
    gate, started = _stall(store)
    for i in range(3):
        assert store.put(h(i), toks(i), payload(i), META)
    assert started.wait(10)
    threading.Timer(0.3, gate.set).start()
    assert store.close(timeout=0.05) is False
    assert not store.put(h(9), toks(9), payload(9), META)
    assert store.close(timeout=10)  # idempotent
    assert store.stats().pending_writes == 0


def test_the_context_manager_flushes_and_closes(tmp_path: Path) -> None:
    with DiskStore(tmp_path / "c", max_bytes=1 << 20) as store:
        write(store, 0)
        assert store.put(h(1), toks(1), payload(1), META)
    assert not store.put(h(2), toks(2), payload(2), META)
    assert DiskStore(tmp_path / "c", max_bytes=1 << 20).count_prefix([h(0), h(1)]) == 2


def test_a_failing_write_disables_the_store_without_raising(open_store, caplog) -> None:
    """A real filesystem error: the page's folder name is taken by a file, so creating it fails (even as root)."""
    store = open_store()
    ok_hash, bad = b"\x01" * 16, [b"\xab" + bytes([i]) * 15 for i in range(3)]
    assert store.put(ok_hash, toks(0), payload(0), META) and store.flush(10)
    blocker = Path(store.pages_dir) / "ab"
    blocker.write_text("not a folder")
    assert store.put(bad[0], toks(1), payload(1), META)
    assert store.put(bad[1], toks(2), payload(2), META)
    assert store.flush(10)
    assert not store.enabled
    assert not store.put(bad[2], toks(3), payload(3), META)
    s = store.stats()
    assert (s.pages, s.writes, s.dropped_writes) == (1, 1, 3)
    assert len(disk_warnings(caplog)) == 1 and "disabled" in disk_warnings(caplog)[0].getMessage()
    assert list(Path(store.tmp_dir).iterdir()) == []  # the failed write's temporary file is gone
    assert store.read(ok_hash, toks(0)) == (payload(0), META)  # what is on disk is still served


@needs_permissions
def test_a_read_only_pages_folder_disables_the_store_without_raising(open_store, caplog) -> None:
    store = open_store()
    pages = Path(store.pages_dir)
    pages.chmod(0o500)
    try:
        assert store.put(h(0), toks(0), payload(0), META)
        assert store.flush(10)
        assert not store.enabled
        assert not store.put(h(1), toks(1), payload(1), META)
        assert len(disk_warnings(caplog)) == 1
        assert list(Path(store.tmp_dir).iterdir()) == []
    finally:
        pages.chmod(0o700)


@needs_permissions
def test_an_unwritable_directory_opens_disabled(tmp_path: Path, caplog) -> None:
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        store = DiskStore(parent / "cache", max_bytes=1 << 20)
        assert not store.enabled
        assert not store.put(h(0), toks(0), payload(0), META)
        assert store.count_prefix([h(0)]) == 0 and store.read(h(0), toks(0)) is None
        assert len(disk_warnings(caplog)) == 1
    finally:
        parent.chmod(0o700)


@needs_permissions
def test_a_read_only_cache_still_serves_its_pages(open_store, caplog) -> None:
    store = open_store()
    write(store, 0)
    store.close()
    folders = [Path(store.directory), Path(store.tmp_dir)]
    for folder in folders:
        folder.chmod(0o500)
    try:
        ro = open_store()
        assert not ro.enabled and len(disk_warnings(caplog)) == 1
        assert ro.read(h(0), toks(0)) == (payload(0), META)
    finally:
        for folder in folders:
            folder.chmod(0o700)


def test_threads_putting_and_reading_keep_the_index_consistent(open_store, tmp_path: Path) -> None:
    probe = open_store(directory=tmp_path / "probe")
    write(probe, 0)
    size = probe.stats().bytes
    store = open_store(max_bytes=40 * size, max_pending=16)  # evicts while the reader reads
    n, bad, done = 200, [], threading.Event()

    def writer() -> None:
        for i in range(n):
            while not store.put(h(i), toks(i), payload(i), META) and h(i) not in store:
                if not store.enabled:
                    bad.append("disabled")
                    return
                time.sleep(0.0005)  # the queue is full: wait for the writer
        done.set()

    def reader() -> None:
        rng = random.Random(0)
        while not done.is_set():
            i = rng.randrange(n)
            got = store.read(h(i), toks(i))
            if got is not None and got != (payload(i), META):
                bad.append(f"page {i} read back wrong")
            store.count_prefix([h(j) for j in range(i, i + 8)])

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert store.flush(10) and not bad
    s = store.stats()
    files = sorted(Path(store.pages_dir).rglob("*.kvpage"))
    assert s.pages == len(files) and s.bytes == sum(f.stat().st_size for f in files) <= 40 * size
    assert s.corrupt_pages == 0 and s.writes == n and s.evicted_pages == n - s.pages
    assert {f.stem for f in files} == {k.hex() for k in (h(i) for i in range(n)) if k in store}
    assert open_store().stats().pages == s.pages


# ------------------------------------------------------------------------------------------------ verify, clear


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


def test_clear_deletes_pages_and_temporary_files(open_store) -> None:
    store = open_store()
    write(store, 0, 1, 2)
    (Path(store.tmp_dir) / "garbage.tmp").write_bytes(b"x")
    assert store.clear() == 3
    assert store.stats().pages == 0 and store.count_prefix([h(0)]) == 0
    assert list(Path(store.pages_dir).rglob("*.kvpage")) == [] and list(Path(store.tmp_dir).iterdir()) == []
    assert (Path(store.directory) / MARKER_NAME).exists()
    assert open_store().stats().pages == 0
    write(store, 4)  # still usable
    assert store.read(h(4), toks(4)) == (payload(4), META)


def test_clear_refuses_a_directory_without_the_marker(open_store) -> None:
    store = open_store()
    write(store, 0)
    (Path(store.directory) / MARKER_NAME).unlink()
    with pytest.raises(ValueError, match=str(store.directory)):
        store.clear()
    assert page_path(store, h(0)).exists()
