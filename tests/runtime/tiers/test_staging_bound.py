"""Staging memory for disk prefetches is bounded in bytes (runtime.kv.tier.staging, kv.tier.prefetch): the pool's
pages (no load copies more), at most a fixed budget. Before, the bound was 4096 pages whatever their size (3 GB of
SmolLM2's pages); then the host tier's size, and a small host tier cut the disk loads an engine without one took
whole. The bytes held are measured here by wrapping the allocator (buffers handed out and not yet back, plus those
kept), independently of its own counters, and outputs equal a no-cache engine's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.kv.tier.staging import StagingBuffers
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.tiers.test_prefetch import DTYPE, P, baseline, ids, restarted, run_out, written

SHAPE = (2, 2, 4, 1, 8)  # layers, K/V, page_size, kv_heads, head_dim


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=11)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


class HeldBytes:
    """Wraps a StagingBuffers' `get` and `put`: the most bytes ever held (out to jobs, and kept)."""

    def __init__(self, buffers: StagingBuffers) -> None:
        self.buffers, self._get, self._put = buffers, buffers.get, buffers.put
        self.out: dict[int, int] = {}  # data_ptr -> bytes of the buffers handed out
        self.peak = buffers.kept_bytes
        buffers.get, buffers.put = self.get, self.put  # instance attributes shadow the methods

    def get(self, pages: int):
        buf, view = self._get(pages)
        self.out[buf.data_ptr()] = buf.numel() * buf.element_size()
        self.peak = max(self.peak, sum(self.out.values()) + self.buffers.kept_bytes)
        return buf, view

    def put(self, buf: torch.Tensor) -> None:
        self.out.pop(buf.data_ptr(), None)
        self._put(buf)


def test_the_allocator_holds_at_most_its_bytes() -> None:
    page = 2 * 2 * 4 * 1 * 8 * 4
    bufs = StagingBuffers(SHAPE, torch.float32, keep_bytes=10 * page, max_bytes=10 * page)
    held = HeldBytes(bufs)
    a, _ = bufs.get(4)
    b, _ = bufs.get(4)
    assert not bufs.fits(4) and bufs.fits(2)
    bufs.put(a)
    assert bufs.fits(4) and bufs.fits(6) and not bufs.fits(7)  # 6 new pages fit once the kept 4 go; 7 never
    bufs.put(b)
    c, _ = bufs.get(10)  # both kept buffers dropped to make room
    assert bufs.kept_bytes == 0 and bufs.held_bytes == 10 * page
    bufs.put(c)
    assert held.peak <= 10 * page and bufs.peak_bytes == held.peak


def _page_bytes(model: RandomModel) -> int:
    with Engine(model, capacity_blocks=200, page_size=P, enable_cache=False, dtype=DTYPE) as probe:
        return probe.pool.num_layers * 2 * P * probe.pool.kv_heads * probe.pool.head_dim * 8


def test_prefetch_staging_stays_within_the_pools_bytes(model, tmp_path: Path) -> None:
    """Three requests whose 10 pages each are on disk arrive together at a pool of 12 pages: the staging never holds
    more than the pool's bytes (the next prefetch waits for the last's staging), each request loads its 10 pages from
    disk, and every output equals the no-cache engine's."""
    prompts = [ids(42, 1), ids(42, 3), ids(42, 4)]  # 10 full pages each before the last token
    wants = [baseline(model, p, 3) for p in prompts]
    written(model, tmp_path, *prompts)
    page = _page_bytes(model)
    bound = 12 * page
    with restarted(model, tmp_path, capacity_blocks=12, prefetch_policy="wait_complete") as engine:
        reader = engine.tiers.reader
        assert reader.buffers.page_bytes == page and reader.buffers.max_bytes == bound
        held = HeldBytes(reader.buffers)
        requests = [engine._request(p, 3, ignore_eos=True) for p in prompts]
        for r in requests:
            engine.scheduler.add(r)
        run_out(engine)
        assert [r.output_ids for r in requests] == wants and all(r.error is None for r in requests)
        assert 0 < held.peak <= bound and reader.buffers.peak_bytes <= bound
        assert engine.stats.tiers.disk_loaded_pages == 30 and engine.stats.tiers.disk_failed_reads == 0
        engine.check()


def test_a_small_host_tier_does_not_cut_a_disk_load(model, tmp_path: Path) -> None:
    """A host tier of 3 pages beside the disk tier: a restart's 10 disk pages all load, as without a host tier (the
    staging bound was the host tier's size: 3 pages loaded, 7 recomputed), and the output equals the no-cache one."""
    prompt = ids(42, 1)
    want = baseline(model, prompt, 3)
    written(model, tmp_path, prompt)
    host = 3 * _page_bytes(model)
    with restarted(model, tmp_path, host_kv_memory=host, prefetch_policy="wait_complete") as engine:
        got = engine.generate(prompt, max_new_tokens=3, ignore_eos=True)
        assert list(got.token_ids) == want
        assert engine.stats.tiers.disk_loaded_pages == 10 and engine.stats.tiers.disk_failed_reads == 0
        assert got.cached_tokens == 40
