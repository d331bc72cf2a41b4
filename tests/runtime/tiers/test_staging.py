"""Staging memory kept across prefetches (runtime.kv.tier.staging): a buffer is reused by a later job with room for
it, never while a reader or the loop still uses it; kept bytes stay under the bound. Through engines: requests whose
prefixes come off the disk one after another reuse one buffer and still give the no-cache engine's tokens; a job
cancelled while a reader is mid-page keeps its buffer out of reuse until that reader is done."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.kv.tier.staging import StagingBuffers
from tests.runtime.tiers.test_prefetch import DTYPE, Gate, P, assert_clean, baseline, ids, model, restarted, step

__all__ = ["model"]  # the fixture, shared with test_prefetch
SHAPE = (2, 2, 4, 1, 3)  # layers, 2, page_size, kv_heads, head_dim


def test_a_returned_buffer_serves_a_later_job_with_room() -> None:
    bufs = StagingBuffers(SHAPE, torch.float32)
    buf, view = bufs.get(5)
    assert view.shape == (2, 2, 5, 4, 1, 3) and buf.data_ptr() == view.data_ptr()
    bufs.put(buf)
    again, small = bufs.get(3)  # the kept one has room
    assert again is buf and small.shape[2] == 3 and small.data_ptr() == buf.data_ptr()
    other, _ = bufs.get(3)  # the kept one is taken: a new one
    assert other is not buf and bufs.allocated == 2
    bufs.put(again)
    bigger, _ = bufs.get(6)  # none kept is large enough
    assert bigger is not buf and bufs.allocated == 3


def test_kept_bytes_stay_under_the_bound() -> None:
    page = 2 * 2 * 4 * 1 * 3 * 4
    bufs = StagingBuffers(SHAPE, torch.float32, keep_bytes=10 * page)
    made = [bufs.get(n)[0] for n in (2, 3, 6, 11)]
    for buf in made:
        bufs.put(buf)
        assert bufs.kept_bytes <= 10 * page
    assert bufs.kept_bytes == 6 * page + 3 * page  # 11 pages is never kept; the smallest went to make room
    assert bufs.get(4)[0] is made[2] and bufs.get(1)[0] is made[1]


def written_each(model, cache_dir: Path, prompts: list[list[int]]) -> None:
    with Engine(model, capacity_blocks=200, page_size=P, cache_dir=cache_dir, dtype=DTYPE) as engine:
        for prompt in prompts:
            engine.generate(prompt, max_new_tokens=1)
        assert engine.flush(30)


def test_prefetches_one_after_another_reuse_one_buffer_and_keep_the_outputs(model, tmp_path: Path) -> None:
    prompts = [ids(42, 30 + i) for i in range(3)]
    written_each(model, tmp_path, prompts)
    with restarted(model, tmp_path) as engine:
        reader = engine.tiers.reader
        for prompt in prompts:
            got = engine.generate(prompt, max_new_tokens=6, ignore_eos=True)
            assert list(got.token_ids) == baseline(model, prompt, 6)
            assert got.cached_tokens == 40  # every full page but the one holding the last token: from disk
        assert engine.stats.tiers.disk_loaded_pages == 30
        assert reader.buffers.allocated == 1 and reader.buffers.kept_bytes > 0


def test_a_buffer_is_not_reused_while_a_reader_is_mid_page(model, tmp_path: Path) -> None:
    first, second = ids(42, 40), ids(42, 41)
    written_each(model, tmp_path, [first, second])
    with restarted(model, tmp_path) as engine:
        gate = Gate(engine)
        reader = engine.tiers.reader
        req = engine._request(first, 4, ignore_eos=True)
        engine.scheduler.add(req)
        assert gate.entered.wait(30)  # a reader is inside the first job's first page
        assert engine.scheduler.abort(req)  # the loop lets go of the job now
        engine.scheduler.drain()
        assert reader.buffers.kept_bytes == 0  # a reader still writes into it: not kept yet
        gate.opened.set()
        for _ in range(3000):  # the readers finish (the cancelled job's other pages are skipped)
            if reader.buffers.kept_bytes:
                break
            threading.Event().wait(0.01)
        assert reader.buffers.kept_bytes > 0
        tokens = engine.generate(second, max_new_tokens=5, ignore_eos=True).token_ids
        assert list(tokens) == baseline(model, second, 5)
        assert reader.buffers.allocated == 1  # the second request read into the first's buffer
        assert engine._loop.wait_idle(30)
        step(engine)
        assert_clean(engine)


@pytest.mark.parametrize("pages", [1, 7])
def test_staging_views_hold_what_the_readers_wrote(pages: int) -> None:
    bufs = StagingBuffers(SHAPE, torch.float64)
    buf, _ = bufs.get(8)
    buf.fill_(-1.0)
    bufs.put(buf)
    _, view = bufs.get(pages)
    for i in range(pages):
        view[:, :, i] = float(i)
    assert all(bool((view[:, :, i] == i).all()) for i in range(pages))
    assert bool((buf[:, :, pages:] == -1.0).all())  # nothing past the view was touched


def test_a_read_on_the_callers_thread_hands_its_buffer_back(tmp_path: Path) -> None:
    from radixcache.runtime.kv.pool import KVPool
    from radixcache.runtime.kv.tier.disk_store import DiskStore
    from radixcache.runtime.kv.tier.page_copy import copy_staged
    from radixcache.runtime.kv.tier.prefetch import PrefetchReader
    from radixcache.runtime.kv.tier.prefetch_job import PrefetchJob
    from radixcache.runtime.testing import tiny_model

    pool = KVPool(tiny_model(seed=3).config, 8, P, dtype=torch.float64)
    pool.kv.copy_(torch.randn(pool.kv.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5)))
    store = DiskStore(str(tmp_path / "cache"), max_bytes=1 << 30)
    meta = {"dtype": str(pool.dtype), "shape": list(pool.kv[:, :, 0].shape)}
    keys = [bytes([i]) * 16 for i in range(3)]
    tokens = [list(range(i * P, (i + 1) * P)) for i in range(3)]
    for i in range(3):
        store.put(keys[i], tokens[i], pool.kv[:, :, i].contiguous().view(torch.uint8).numpy().tobytes(), meta)
    assert store.flush(30)
    reader = PrefetchReader(store, pool, prewarm_pages=0)  # the prewarm: the test below
    for _ in range(2):
        job = PrefetchJob(0, keys, tokens, [])
        got, staging = reader.read_now(job)
        assert got == 3 and staging is not None
        copy_staged(pool, staging, got, [5, 6, 7])
        reader.release(job)
        assert job.staging is None and reader.buffers.kept_bytes == 3 * reader.buffers.page_bytes
    assert reader.buffers.allocated == 1
    assert torch.equal(pool.kv[:, :, 5:8], pool.kv[:, :, 0:3])  # the pages, bit for bit, read twice through one buffer
    reader.close()
    store.close()


def test_a_read_on_the_callers_thread_without_staging_memory_reads_nothing(tmp_path: Path) -> None:
    """The staging of a direct read (a caller that never prefetched) cannot be allocated: nothing is read and its
    pages are recomputed, as for a queued prefetch (before: the error failed the request being admitted)."""
    from radixcache.runtime.kv.pool import KVPool
    from radixcache.runtime.kv.tier.disk_store import DiskStore
    from radixcache.runtime.kv.tier.prefetch import PrefetchReader
    from radixcache.runtime.kv.tier.prefetch_job import PrefetchJob
    from radixcache.runtime.testing import tiny_model

    pool = KVPool(tiny_model(seed=3).config, 8, P, dtype=torch.float64)
    store = DiskStore(str(tmp_path / "cache"), max_bytes=1 << 30)
    meta = {"dtype": str(pool.dtype), "shape": list(pool.kv[:, :, 0].shape)}
    store.put(b"\1" * 16, list(range(P)), pool.kv[:, :, 0].contiguous().view(torch.uint8).numpy().tobytes(), meta)
    assert store.flush(30)
    reader = PrefetchReader(store, pool, prewarm_pages=0)

    def no_memory(pages: int):
        raise RuntimeError("injected: cannot allocate staging memory")

    reader.buffers.get = no_memory
    job = PrefetchJob(0, [b"\1" * 16], [list(range(P))], [])
    assert reader.read_now(job) == (0, None)
    assert job.complete and job.failed_at == 0 and store.stats().read_hits == 0
    reader.release(job)
    del reader.buffers.get
    job = PrefetchJob(0, [b"\1" * 16], [list(range(P))], [])
    assert reader.read_now(job)[0] == 1  # the next read has its staging
    reader.release(job)
    reader.close()
    store.close()


def test_a_prewarmed_buffer_serves_the_first_job_and_stays_within_the_bound(tmp_path: Path) -> None:
    from radixcache.runtime.kv.pool import KVPool
    from radixcache.runtime.kv.tier.disk_store import DiskStore
    from radixcache.runtime.kv.tier.prefetch import PrefetchReader
    from radixcache.runtime.kv.tier.prefetch_job import PrefetchJob
    from radixcache.runtime.testing import tiny_model

    page = 2 * 2 * 4 * 1 * 3 * 4
    bufs = StagingBuffers(SHAPE, torch.float32, keep_bytes=10 * page)
    bufs.prewarm(64)  # more than the bound keeps: as many pages as it does
    assert bufs.allocated == 1 and bufs.kept_bytes == 10 * page
    bufs.prewarm(0)
    assert bufs.allocated == 1
    buf, view = bufs.get(7)
    assert buf.shape[2] == 10 and view.shape[2] == 7 and not buf.any()  # written once, with zeros
    pool = KVPool(tiny_model(seed=3).config, 8, P, dtype=torch.float64)
    store = DiskStore(str(tmp_path / "cache"), max_bytes=1 << 30)
    reader = PrefetchReader(store, pool, prewarm_pages=16)  # written before the constructor returns
    job = PrefetchJob(0, [b"\1" * 16], [list(range(P))], [])
    reader.read_now(job)  # takes the prewarmed buffer (the page itself is missing on disk)
    assert reader.buffers.allocated == 1 and job.buffer is not None and job.buffer.shape[2] == 16
    reader.release(job)
    assert reader.buffers.kept_bytes == 16 * reader.buffers.page_bytes
    reader.close()
    store.close(10)
