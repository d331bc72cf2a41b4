"""Disk tier failures stay with the read or write that met them and never corrupt the store: a pages folder that
vanished, a garbled marker, deletions that fail with an error other than file-not-found (evictions, corrupt pages,
verify), reads that fail with EIO, and, through the engine, failing reads and an unwritable cache directory, where
every output equals a no-cache engine's. Errors are simulated (tests/runtime/tier_faults/fs_faults.py), so these
run as root too.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
from pathlib import Path

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.kv.tier import disk_files, prefetch_jobs
from radixcache.runtime.kv.tier.disk_store import MARKER_NAME
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.conftest import META, disk_warnings, h, page_path, payload, toks, write
from tests.runtime.tier_faults.fs_faults import deny_writes, fail_reads, fail_unlinks


def test_a_vanished_pages_folder_is_a_miss_then_written_again(open_store) -> None:
    store = open_store()
    write(store, 0, 1)
    shutil.rmtree(store.pages_root)
    assert store.read(h(0), toks(0)) is None
    assert store.count_prefix([h(0)]) == 0 and store.count_prefix([h(1)]) == 1  # only what was tried is forgotten
    assert store.enabled
    write(store, 2)  # the folders are made again
    assert store.read(h(2), toks(2)) == (payload(2), META)
    assert store.read(h(1), toks(1)) is None and store.stats().corrupt_pages == 0


def test_a_garbled_marker_leaves_the_directory_untouched(open_store, caplog) -> None:
    store = open_store()
    write(store, 0)
    store.close()
    (Path(store.directory) / MARKER_NAME).write_text('{"format": "radixcache-kv-pa')
    before = sorted(p.relative_to(store.directory) for p in Path(store.directory).rglob("*"))
    garbled = open_store()
    assert not garbled.enabled and garbled.count_prefix([h(0)]) == 0 and garbled.read(h(0), toks(0)) is None
    assert not garbled.put(h(1), toks(1), payload(1), META)
    with pytest.raises(ValueError, match="marker"):
        garbled.clear()
    assert sorted(p.relative_to(store.directory) for p in Path(store.directory).rglob("*")) == before
    assert len(disk_warnings(caplog)) == 1


def test_an_eviction_that_cannot_delete_disables_writes_and_keeps_serving(open_store, caplog, monkeypatch) -> None:
    store = open_store(max_bytes=3 * 600)
    write(store, 0, 1, 2)
    fail_unlinks(monkeypatch, store.pages_root)
    write(store, 3)  # over max_bytes: evicting page 0 fails with EPERM
    assert not store.enabled and "cannot delete" in disk_warnings(caplog)[0].getMessage()
    assert not store.put(h(4), toks(4), payload(4), META)
    for i in (1, 2, 3):
        assert store.read(h(i), toks(i)) == (payload(i), META)
    assert store.count_prefix([h(0)]) == 0 and page_path(store, h(0)).exists()  # left on disk, out of the index


def test_a_corrupt_page_that_cannot_be_deleted_is_still_never_served(open_store, monkeypatch) -> None:
    store = open_store()
    write(store, 0, 1)
    path = page_path(store, h(0))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    fail_unlinks(monkeypatch, store.pages_root)
    assert store.read(h(0), toks(0)) is None
    assert store.read(h(0), toks(0)) is None and store.count_prefix([h(0)]) == 0
    assert store.stats().corrupt_pages == 1 and store.enabled
    report = store.verify()
    assert report.corrupt == (str(path),) and report.removed == 0 and report.ok == 1
    assert store.read(h(1), toks(1)) == (payload(1), META)


def test_a_read_error_other_than_not_found_is_a_miss_that_keeps_the_page(open_store, monkeypatch) -> None:
    store = open_store()
    write(store, 0)
    with monkeypatch.context() as m:
        fail_reads(m, store.pages_root)
        assert store.read(h(0), toks(0)) is None
        assert store.stats().read_misses == 1 and store.stats().corrupt_pages == 0 and store.enabled
    assert store.read(h(0), toks(0)) == (payload(0), META)  # the error passed: the page was never dropped


# ------------------------------------------------------------------------------------ through the engine

MAX_NEW = 6


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=5)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(2)
    system = [rng.randrange(vocab) for _ in range(24)]
    return [system + [rng.randrange(vocab) for _ in range(8)] for _ in range(5)]


def _generate(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    return [engine.generate(p, max_new_tokens=MAX_NEW).token_ids for p in prompts]


def test_engine_outputs_stay_right_when_disk_reads_fail_or_the_directory_is_read_only(
    model: RandomModel, tmp_path: Path, monkeypatch
) -> None:
    prompts = _prompts(model.config.vocab_size)
    opts = {"page_size": 4, "capacity_blocks": 200, "dtype": "float64", "load_back": "always"}
    with Engine(model, enable_cache=False, **opts) as plain:
        want = _generate(plain, prompts)
    with Engine(model, cache_dir=tmp_path / "kv", **opts) as first:
        assert _generate(first, prompts) == want
        assert first.flush(30)
    with monkeypatch.context() as m:
        fail_reads(m, tmp_path / "kv" / "pages")  # every page read fails with EIO: recomputed
        with Engine(model, cache_dir=tmp_path / "kv", **opts) as failing:
            assert _generate(failing, prompts) == want
            assert failing.stats.tiers.disk_failed_reads > 0 and failing.stats.tiers.disk_hit_tokens == 0
            failing.check()
    with monkeypatch.context() as m:
        deny_writes(m, tmp_path / "kv")  # read-only: served from disk, nothing written
        with Engine(model, cache_dir=tmp_path / "kv", **opts) as read_only:
            assert _generate(read_only, prompts) == want
            assert read_only.stats.tiers.disk_hit_tokens > 0
            read_only.check()
    deny_root = tmp_path / "ro"
    deny_root.mkdir()
    with monkeypatch.context() as m:
        deny_writes(m, deny_root)  # cannot even create the directory: no disk tier, no failed request
        with Engine(model, cache_dir=deny_root / "kv", **opts) as unwritable:
            assert _generate(unwritable, prompts) == want


def test_engine_requests_survive_disk_writes_and_page_loads_that_raise(
    model: RandomModel, tmp_path: Path, monkeypatch
) -> None:
    """Not an OSError the store handles: the writer's queue or a page's read into staging memory raising."""
    prompts = _prompts(model.config.vocab_size)
    opts = {"page_size": 4, "capacity_blocks": 200, "dtype": "float64", "load_back": "always"}
    with Engine(model, enable_cache=False, **opts) as plain:
        want = _generate(plain, prompts)
    with Engine(model, cache_dir=tmp_path / "kv", **opts) as engine:
        real_put = engine.tiers.disk.put
        calls = [0]

        def put(*args, **kw):
            calls[0] += 1
            if calls[0] % 3 == 0:
                raise RuntimeError("injected: queueing a disk write failed")
            return real_put(*args, **kw)

        monkeypatch.setattr(engine.tiers.disk, "put", put)
        assert _generate(engine, prompts) == want
        assert engine.stats.tiers.disk_dropped_pages > 0 and engine.flush(30)
        engine.check()
    with Engine(model, cache_dir=tmp_path / "kv", **opts) as engine:
        real_read = engine.tiers.disk.read_into

        def read_into(page_hash, tokens, rows, head, *split):
            meta = real_read(page_hash, tokens, rows, head, *split)
            if meta is not None and page_hash[0] % 2:
                raise RuntimeError("injected: a page read raised once its bytes had arrived")
            return meta

        monkeypatch.setattr(engine.tiers.disk, "read_into", read_into)
        assert _generate(engine, prompts) == want
        assert engine.stats.tiers.disk_failed_reads > 0
        engine.check()


def test_a_copy_of_read_pages_into_the_pool_that_raises_is_a_failed_read(
    model: RandomModel, tmp_path: Path, monkeypatch
) -> None:
    """The pages arrived in staging; their one batched copy into the request's blocks raises: the request
    recomputes them and goes on (it failed with the copy's error)."""
    prompts = _prompts(model.config.vocab_size)
    opts = {"page_size": 4, "capacity_blocks": 200, "dtype": "float64", "load_back": "always"}
    with Engine(model, enable_cache=False, **opts) as plain:
        want = _generate(plain, prompts)
    with Engine(model, cache_dir=tmp_path, **opts) as first:
        assert _generate(first, prompts) == want and first.flush(30)

    def copy_staged(*args) -> None:
        raise RuntimeError("injected: copying read pages into the pool failed")

    monkeypatch.setattr(prefetch_jobs, "copy_staged", copy_staged)
    with Engine(model, cache_dir=tmp_path, **opts) as engine:
        assert _generate(engine, prompts) == want
        tiers = engine.stats.tiers
        assert tiers.disk_failed_reads == len(prompts) and tiers.disk_loaded_pages == tiers.disk_hit_tokens == 0
        engine.check()


def test_pages_deleted_behind_the_engine_are_all_written_again_once_recomputed(model: RandomModel, tmp_path) -> None:
    """A `cache clear` or another process's eviction: the engine's index still lists the files. The read stops at
    the first missing page; every page of the prompt recomputed after it must reach the disk again, not one per
    request (a restart then found 1 or 2 of its 8 pages)."""
    prompt = _prompts(model.config.vocab_size)[0]
    opts = {"page_size": 4, "capacity_blocks": 200, "dtype": "float64", "load_back": "always"}
    with Engine(model, enable_cache=False, **opts) as plain:
        want = _generate(plain, [prompt])
    with Engine(model, cache_dir=tmp_path, **opts) as engine:
        assert _generate(engine, [prompt]) == want and engine.flush(30)
        files = list(tmp_path.rglob("*.kvpage"))
        assert len(files) > len(prompt) // 4
        for f in files:
            f.unlink()
        assert engine.wait_idle(30)
        engine.cache.evict(engine.cache.evictable_blocks)  # the next request looks below the device
        assert _generate(engine, [prompt]) == want and engine.flush(30)
        engine.check()
    with Engine(model, cache_dir=tmp_path, **opts) as restarted:
        assert _generate(restarted, [prompt]) == want
        assert restarted.stats.tiers.disk_hit_tokens == len(prompt) - 1  # every page, the last token's cut


def test_a_page_whose_folder_fsync_fails_leaves_index_and_directory_equal(open_store, monkeypatch) -> None:
    """ENOSPC (or EIO) at the folder's fsync comes after the rename: the page file is in place, but the write
    failed. The file was left out of the index and the byte total until a restart; it is removed."""
    store = open_store()
    write(store, 0)
    real_fsync_dir = disk_files.fsync_dir

    def full_disk(path: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(disk_files, "fsync_dir", full_disk)
    assert store.put(h(1), toks(1), payload(1), META) and store.flush(timeout=10)
    monkeypatch.setattr(disk_files, "fsync_dir", real_fsync_dir)
    files = sorted(Path(store.pages_dir).rglob("*.kvpage"))
    stats = store.stats()
    assert not stats.enabled  # the write failed: the store stops writing, as for any write error
    assert (stats.pages, stats.bytes) == (len(files), sum(f.stat().st_size for f in files))
    assert files == [page_path(store, h(0))]


def test_a_clear_that_takes_a_pages_temporary_file_twice_drops_that_page_only(open_store, monkeypatch) -> None:
    """`cache clear` run again and again against a live engine's directory deletes every temporary file, the
    writer's too: a write whose temporary file vanished on both its tries (ENOENT at the rename) disabled disk writes
    for the rest of the process. That page is dropped; the store writes the next ones."""
    store = open_store()
    real_replace = os.replace
    raced = []

    def clear_races(src, dst, *a, **kw):
        if str(dst).endswith(".kvpage") and Path(dst).name.startswith(h(0).hex()):
            raced.append(src)
            os.unlink(src)  # what the clear does to every temporary file of the store's naming
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", clear_races)
    assert store.put(h(0), toks(0), payload(0), META) and store.flush(timeout=10)
    assert len(raced) == 2  # both tries lost their file
    write(store, 1)
    stats = store.stats()
    assert stats.enabled
    assert store.read(h(1), toks(1)) == (payload(1), META)
    assert store.count_prefix([h(0)]) == 0 and not page_path(store, h(0)).exists()
    assert stats.dropped_writes == 1 and stats.pages == 1
