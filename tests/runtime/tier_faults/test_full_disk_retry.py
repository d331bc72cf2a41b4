"""A disk that fills turns the disk tier's writing off only for a while: writes are tried again after a pause (60 s,
doubled at each try that finds the disk still full, up to an hour), and a write that succeeds, once space was
freed, ends it (`enabled`, `disabled_reason`, `engine.stats.disk_tier_up` back). Until 2026-12-07 a full disk turned
writing off for the rest of the process, and a server whose disk filled for a minute never wrote a page again. Other
write errors (a read-only file system, a file size limit, an unwritable directory) still turn it off for good. The
full disk is a write that raises ENOSPC until the test frees it; the pause's clock is the test's. A disk smaller than
the store's `max_bytes` is one whose page files past a capacity raise ENOSPC: the store deletes its oldest pages to
make room, and writes on without a pause."""

from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.kv.tier import disk_layout
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.conftest import META, h, page_path, payload, toks, write


class FullDisk:
    """The store's page write, failing with `code` while `full`; a clock the test moves."""

    def __init__(self, store: DiskStore, code: int = errno.ENOSPC) -> None:
        self._write, self.code, self.full, self.now = store._write_page, code, True, 0.0
        store._write_page = self.write  # the instance attribute shadows the method: the writer calls this
        if hasattr(store, "backoff"):  # (none before the pause: writing stayed off for good)
            store.backoff.clock = lambda: self.now

    def write(self, page):
        if self.full:
            raise OSError(self.code, "No space left on device" if self.code == errno.ENOSPC else "Read-only")
        return self._write(page)


def _put(store: DiskStore, i: int) -> bool:
    queued = store.put(h(i), toks(i), payload(i), META)
    assert store.flush(timeout=10)
    return queued


def test_writing_pauses_on_a_full_disk_and_resumes_once_space_is_freed(open_store) -> None:
    store = open_store()
    write(store, 0)
    disk = FullDisk(store)
    assert _put(store, 1)  # queued; its write finds the disk full
    assert not store.enabled and "No space" in store.disabled_reason and store.count_prefix([h(1)]) == 0
    assert not _put(store, 2)  # paused: refused, not tried
    disk.now = 59.0
    assert not store.enabled
    disk.now = 60.0  # the pause is over; the disk is still full: tried, paused again twice as long
    assert store.enabled and _put(store, 2) and not store.enabled
    disk.now = 179.0
    assert not store.enabled and not _put(store, 2)
    disk.full = False  # space freed
    disk.now = 180.0
    assert _put(store, 2) and store.enabled and store.disabled_reason is None
    assert store.read(h(2), toks(2)) == (payload(2), META) and store.read(h(0), toks(0)) == (payload(0), META)
    disk.full = True  # full again later: the first pause again, not the doubled one
    assert _put(store, 3) and not store.enabled
    disk.now = 240.0
    assert store.enabled
    assert store.stats().dropped_writes == 5  # 3 writes failed (pages 1, 2, 3), 2 refused while paused (page 2)


@pytest.mark.parametrize("code", [errno.EROFS, errno.EFBIG])
def test_other_write_errors_still_turn_writing_off_for_good(open_store, code: int) -> None:
    store = open_store()
    disk = FullDisk(store, code)
    assert _put(store, 0) and not store.enabled
    disk.full, disk.now = False, 1e9
    assert not store.enabled and not _put(store, 1) and store.disabled_reason is not None


def test_an_engine_writes_pages_again_after_its_disk_was_full(tmp_path: Path) -> None:
    m = tiny_model(seed=5)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    rng = random.Random(6)
    first, second = ([rng.randrange(1, m.config.vocab_size) for _ in range(40)] for _ in range(2))
    opts = {"capacity_blocks": 100, "page_size": 4, "dtype": "float64", "load_back": "always"}
    with Engine(model, enable_cache=False, **opts) as plain:
        want = [plain.generate(p, 4).token_ids for p in (first, second)]
    with Engine(model, cache_dir=tmp_path / "kv", **opts) as engine:
        disk = FullDisk(engine.tiers.disk)
        assert engine.generate(first, 4).token_ids == want[0]
        assert engine.flush(30) and engine.stats.disk_tier_up == 0
        disk.full, disk.now = False, 61.0  # space freed, the pause over
        assert engine.generate(second, 4).token_ids == want[1]
        assert engine.flush(30) and engine.stats.disk_tier_up == 1
    with Engine(model, cache_dir=tmp_path / "kv", **opts) as restarted:
        got = [restarted.generate(p, 4) for p in (second, first)]
        assert [g.token_ids for g in got] == [want[1], want[0]]
        assert got[0].cached_tokens == 39 and got[1].cached_tokens == 0  # written after the pause; dropped in it
        restarted.check()


def test_a_store_opened_on_a_full_disk_writes_once_space_is_freed(open_store, tmp_path: Path, monkeypatch) -> None:
    """A server restarted while its disk is full: the open cannot write a new fingerprint's folder (its
    fingerprint.json). It used to turn writing off for the process; now it pauses, and the first write after the
    pause makes the folders and writes the page, which a later open reads."""
    write(open_store(), 0)  # a marked cache directory
    real = disk_layout.write_json_durable

    def full(path, value, tmp_dir):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(disk_layout, "write_json_durable", full)
    store = open_store(fingerprint="another model")
    assert not store.enabled and "No space" in store.disabled_reason
    monkeypatch.setattr(disk_layout, "write_json_durable", real)  # space freed
    store.backoff.clock = lambda: 1e9  # the pause over
    assert _put(store, 1) and store.enabled and store.read(h(1), toks(1)) == (payload(1), META)
    assert (Path(store.pages_dir) / "fingerprint.json").is_file()
    store.close()
    assert open_store(fingerprint="another model").read(h(1), toks(1)) == (payload(1), META)


def test_a_directory_whose_marker_cannot_be_written_on_a_full_disk_stays_off(open_store, monkeypatch) -> None:
    """Without its marker a directory is not ours: no page is ever written into it, full disk or not."""
    monkeypatch.setattr(disk_layout, "write_json_durable", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "")))
    store = open_store()
    store.backoff.clock = lambda: 1e9
    assert not store.enabled and not _put(store, 0)


class SmallDisk:
    """The store's page write on a disk that holds `capacity` bytes of page files: ENOSPC past it (what the page
    files of the directory take, counted from the directory itself, not from the store's index)."""

    def __init__(self, store: DiskStore, capacity: int) -> None:
        self._write, self.capacity, self.root = store._write_page, capacity, Path(store.directory)
        store._write_page = self.write

    def used(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*.kvpage"))

    def write(self, page):
        if self.used() + page.size > self.capacity:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._write(page)


def test_a_full_disk_deletes_the_oldest_pages_to_make_room_and_writing_goes_on(open_store) -> None:
    """A disk smaller than `max_bytes` (1 MiB here, the disk ten pages): when it fills, the store deletes its least
    recently used pages, as its size limit would, and writes on. Until 2026-12-07 it paused writing instead, for a
    minute and then longer, and the tier kept only what it held when the disk filled."""
    store = open_store()
    write(store, 0)
    size = page_path(store, h(0)).stat().st_size
    disk = SmallDisk(store, capacity=10 * size)
    for i in range(1, 30):
        assert _put(store, i) and store.enabled and store.disabled_reason is None
    stats = store.stats()
    assert stats.writes == 30 and stats.dropped_writes == 0 and disk.used() <= disk.capacity
    held = [i for i in range(30) if store.read(h(i), toks(i)) is not None]
    assert held == list(range(30 - len(held), 30)) and len(held) >= 5  # the newest pages, in order of use
    assert stats.evicted_pages == 30 - len(held) and stats.corrupt_pages == 0
