"""The disk tier's page index (radixcache.runtime.kv.tier.disk_index): rebuilt on reopen, shared by stores on the
same folder, counted per fingerprint, held under the LRU size limit (its order kept across a restart), and
consistent with the files while threads put and read.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

from radixcache.runtime.kv.tier.disk_store import fingerprint_tag
from tests.runtime.conftest import FP, META, h, page_path, payload, toks, write


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


def test_a_restart_with_a_smaller_limit_trims_the_directory_at_open(open_store) -> None:
    store = open_store()
    write(store, 0, 1, 2, 3, 4)
    size = store.stats().bytes // 5
    store.close()
    for i in range(5):
        os.utime(page_path(store, h(i)), (1000 + i, 1000 + i))  # 0 is the least recently used
    smaller = open_store(max_bytes=2 * size)  # no write follows: the limit must hold anyway
    s = smaller.stats()
    assert (s.pages, s.evicted_pages) == (2, 3) and s.bytes <= 2 * size
    assert [page_path(store, h(i)).exists() for i in range(5)] == [False, False, False, True, True]
    assert smaller.read(h(4), toks(4)) == (payload(4), META)


def test_a_page_larger_than_max_bytes_is_not_stored(open_store) -> None:
    store = open_store(max_bytes=200)
    assert not store.put(h(0), toks(0), payload(0), META)
    s = store.stats()
    assert (s.pages, s.dropped_writes) == (0, 1)


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


def test_mtimes_in_the_future_are_brought_back_to_now_at_open_in_their_order(open_store) -> None:
    """Pages stamped while the clock ran a day ahead (corrected between runs) looked the newest at a restart, and
    outlived every page written after it at the size limit: at open they are stamped now (their order kept), so the
    pages written since are newer, also at the next open."""
    store = open_store()
    write(store, 0, 1, 2)
    size = store.stats().bytes // 3
    store.close()
    day = 86400
    for i, ahead in ((0, 2 * day), (1, day), (2, -60)):  # 0 the newest, then 1, then 2 (an hour-old page)
        t = time.time() + ahead
        os.utime(page_path(store, h(i)), (t, t))
    reopened = open_store(max_bytes=3 * size)
    write(reopened, 3)  # newer than all three: 2 goes (the oldest)
    write(reopened, 4)  # then 1 (the older of the two future pages)
    assert [page_path(store, h(i)).exists() for i in range(5)] == [True, False, False, True, True]
    reopened.close()
    assert all(page_path(store, h(i)).stat().st_mtime <= time.time() for i in (0, 3, 4))
    third = open_store(max_bytes=3 * size)
    write(third, 5)  # 0 is now the oldest of the three, by its file's mtime too
    assert [page_path(store, h(i)).exists() for i in (0, 3, 4, 5)] == [False, True, True, True]
