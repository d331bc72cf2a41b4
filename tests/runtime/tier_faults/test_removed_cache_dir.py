"""An `rm -rf` of the whole cache directory while a server runs (an operator freeing space, a tmp cleaner) does not
turn the disk tier's writing off: the next page write makes the directory again, its marker first (so a restart or
`radixcache cache stats` still knows it as a cache), and writing goes on. Before, the write found no `tmp/`, could
not make it under a missing directory, and turned writing off for the rest of the process. A directory that
something else fills in the meantime is still never adopted: writing stops, with a warning that says why."""

from __future__ import annotations

import logging
import shutil

from radixcache.runtime.kv.tier.disk_store import MARKER_NAME, DiskStore
from tests.runtime.conftest import META, h, payload, toks, write


def test_a_removed_cache_directory_is_made_again_by_the_next_write(open_store, tmp_path) -> None:
    store = open_store()
    write(store, 0, 1)
    shutil.rmtree(store.directory)
    write(store, 2)  # a run's head (no parent): written, into a directory made again
    assert store.enabled and store.disabled_reason is None
    assert store.read(h(2), toks(2)) == (payload(2), META)
    assert store.read(h(0), toks(0)) is None and store.stats().corrupt_pages == 0  # gone with the directory: a miss
    write(store, 3)  # and it goes on writing
    assert (tmp_path / "cache" / MARKER_NAME).is_file()
    again = DiskStore(store.directory, max_bytes=1 << 20, create=False)  # a restart's view: still a cache
    report = again.verify(delete=False)
    assert report.corrupt == () and report.ok == report.checked == 2


def test_a_removed_directory_that_something_else_fills_is_not_adopted(open_store, tmp_path, caplog) -> None:
    store = open_store()
    write(store, 0)
    shutil.rmtree(store.directory)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "notes.txt").write_text("someone else's")
    with caplog.at_level(logging.WARNING, logger="radixcache.disk"):
        assert store.put(h(1), toks(1), payload(1), META) and store.flush(timeout=10)
    assert not store.enabled and "vanished" in store.disabled_reason and "not a radixcache cache" in caplog.text
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["notes.txt"]  # nothing written there
