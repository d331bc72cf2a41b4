"""A disk load beside decodes, with the chunk after it staged by layers (SchedulerConfig.staged_prefill_attention):
its pages are copied into the pool layer by layer, each pass copying the layers it runs (kv.tier.layered_load). The
staging is held until the last layer is in, then kept for reuse; a cancel drops the copy; a preemption copies every
layer before the tree takes the pages; outputs equal the no-cache engine's. Orderings and pool contents, never time."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.engine.scheduler import SchedulerConfig
from radixcache.runtime.kv.pool import populate
from radixcache.runtime.kv.tier import layered_load
from radixcache.runtime.kv.tier.page_copy import copy_pages
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.engine.test_kv_pool import resident_pages
from tests.runtime.tiers import test_prefetch as prefetch

LAYERS = 4
BOUND = 30  # the 2-token chunk after 40 cached positions is 83 of work: 3 passes -> 2 layers a pass, 2 passes


@pytest.fixture(scope="module")
def deep() -> RandomModel:
    m = tiny_model(seed=11, num_layers=LAYERS)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def _beside_a_decode(deep: RandomModel, tmp_path: Path):
    """A restarted engine whose disk holds PROMPT's pages, OTHER decoding, PROMPT added and stepped until admitted."""
    config = SchedulerConfig(staged_prefill_attention=BOUND)
    engine, a = prefetch.decoding_beside_disk_pages(deep, tmp_path, 40, scheduler_config=config)
    b = engine._request(prefetch.PROMPT, 5, ignore_eos=True)
    engine.scheduler.add(b)
    for _ in range(200):
        prefetch.step(engine)
        if b.t_admitted is not None:
            return engine, a, b
    raise AssertionError("the long prompt was never admitted")


def _loaded(engine: Engine, b) -> torch.Tensor:
    """The pool's K/V of b's disk-loaded blocks, `[layers, 2, pages, ...]`."""
    blocks = b.kv.block_table[b.kv.tree_blocks : b.kv.tree_blocks + 10]
    return engine.pool.kv[:, :, blocks]


def test_the_load_is_copied_as_the_staged_chunk_reaches_each_layer(deep: RandomModel, tmp_path: Path) -> None:
    want_a, want_b = prefetch.baseline(deep, prefetch.OTHER, 40), prefetch.baseline(deep, prefetch.PROMPT, 5)
    engine, a, b = _beside_a_decode(deep, tmp_path)
    with engine:
        reader = engine.tiers.reader
        assert b.kv.num_kv == 40 and b.kv.tree_blocks == 0, "every prefix page came from the disk"
        assert b.staged is not None and b.staged.next_layer == 2, "the admission step ran the chunk's first 2 layers"
        assert b.kv.pending_load is not None and b.kv.pending_load.next_layer == 2
        kv = _loaded(engine, b)
        assert kv[:2].abs().amax().item() > 0 and kv[2:].abs().amax().item() == 0, "layers 2-3 not copied yet"
        assert reader.buffers.kept_bytes == 0, "the staging is held while layers are left"
        prefetch.step(engine)
        assert b.staged is None and b.kv.pending_load is None and b.output_ids
        assert _loaded(engine, b)[2:].abs().amax().item() > 0
        assert reader.buffers.kept_bytes > 0, "the staging is kept for reuse once every layer is in"
        prefetch.run_out(engine)
        prefetch.assert_clean(engine)
        assert engine.stats.tiers.disk_loaded_pages == 10
    assert list(a.output_ids) == want_a and list(b.output_ids) == want_b


def test_a_cancel_mid_load_drops_the_copy_and_frees_everything(deep: RandomModel, tmp_path: Path) -> None:
    want_a = prefetch.baseline(deep, prefetch.OTHER, 40)
    engine, a, b = _beside_a_decode(deep, tmp_path)
    with engine:
        assert b.kv.pending_load is not None
        load = b.kv.pending_load
        assert engine.scheduler.abort(b)
        assert b.kv.pending_load is None and load.next_layer == 2, "nothing more was copied"
        assert engine.tiers.reader.buffers.kept_bytes > 0, "the staging went back"
        prefetch.run_out(engine)
        prefetch.assert_clean(engine)
    assert list(a.output_ids) == want_a and b.finish_reason == "cancelled"


def test_a_preemption_mid_load_copies_every_layer_before_the_tree_takes_the_pages(
    deep: RandomModel, tmp_path: Path
) -> None:
    want_a, want_b = prefetch.baseline(deep, prefetch.OTHER, 40), prefetch.baseline(deep, prefetch.PROMPT, 5)
    engine, a, b = _beside_a_decode(deep, tmp_path)
    with engine:
        assert b.kv.pending_load is not None
        engine.scheduler._preempt(b)
        assert b.kv.pending_load is None and b in engine.scheduler.waiting
        prefetch.run_out(engine)  # b resumes from the tree's pages: wrong layers there would change its output
        prefetch.assert_clean(engine)
        assert b.kv.preemptions == 1
    assert list(a.output_ids) == want_a and list(b.output_ids) == want_b


@pytest.mark.parametrize("fail_at", [0, 1], ids=["first-layers", "later-layers"])
def test_a_layer_copy_that_raises_is_a_failed_read_and_the_pages_are_recomputed(
    deep: RandomModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int
) -> None:
    """The copy of a staged load's layers raised out of the pass, and the request failed (retried alone) instead of
    recomputing its pages as every failed read does (docs/tiers.md)."""
    want_a, want_b = prefetch.baseline(deep, prefetch.OTHER, 40), prefetch.baseline(deep, prefetch.PROMPT, 5)
    calls = []

    def copy_or_fail(*args) -> None:
        calls.append(len(calls))
        if len(calls) - 1 == fail_at:
            raise RuntimeError("injected: a layer copy failed")
        copy_pages(*args)

    monkeypatch.setattr(layered_load, "copy_pages", copy_or_fail)
    engine, a, b = _beside_a_decode(deep, tmp_path)
    with engine:
        if fail_at == 1:
            assert b.kv.pending_load is not None and b.kv.num_kv == 40
            prefetch.step(engine)
        assert b.kv.pending_load is None and b.kv.num_kv == 0 and b.error is None
        assert engine.tiers.reader.buffers.kept_bytes > 0, "the staging went back"
        prefetch.run_out(engine)
        prefetch.assert_clean(engine)
        tiers = engine.stats.tiers
        assert (tiers.disk_failed_reads, tiers.disk_loaded_pages, tiers.disk_hit_tokens) == (1, 0, 0)
        assert b.kv.cached_tokens == 0 and b.kv.found_pages == 0
    assert len(calls) == fail_at + 1, "no layer was copied after the failure"
    assert list(a.output_ids) == want_a and list(b.output_ids) == want_b and b.finish_reason == "length"


def test_without_decodes_the_load_is_copied_at_once(deep: RandomModel, tmp_path: Path) -> None:
    want = prefetch.baseline(deep, prefetch.PROMPT, 5)
    prefetch.written(deep, tmp_path, prefetch.PROMPT)
    config = SchedulerConfig(staged_prefill_attention=BOUND)
    with prefetch.restarted(deep, tmp_path, prefetch_policy="wait_complete", scheduler_config=config) as engine:
        b = engine._request(prefetch.PROMPT, 5, ignore_eos=True)
        engine.scheduler.add(b)
        for _ in range(200):
            prefetch.step(engine)
            assert b.kv.pending_load is None and b.staged is None
            if b.output_ids:
                break
        prefetch.run_out(engine)
        assert engine.stats.tiers.disk_loaded_pages == 10
        prefetch.assert_clean(engine)
    assert list(b.output_ids) == want


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE and mincore are Linux's")
def test_an_engine_with_a_disk_tier_faults_its_pool_in_as_it_starts(deep: RandomModel, tmp_path: Path) -> None:
    """As the readers start (after the staging prewarm) the pool is populated (kv.pool.populate), so that a load's
    copy into blocks never written before takes no page faults on the loop; no byte changes."""
    with prefetch.restarted(deep, tmp_path, capacity_blocks=2048) as engine:
        kv = engine.pool.kv
        pages = -(-kv.numel() * kv.element_size() // mmap.PAGESIZE)
        if not populate(torch.frombuffer(mmap.mmap(-1, 1 << 20), dtype=torch.uint8)):
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
        assert resident_pages(kv) == pages
        assert torch.count_nonzero(kv) == 0


def test_a_resumed_request_whose_deferred_load_raises_computes_its_positions_first(
    deep: RandomModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B is preempted after 3 tokens, every page of its 44 positions then only on disk: it resumes beside A's decode
    with all of them loaded by layers, and decodes next. The copy raised: its positions fell back to 0, yet it went
    on decoding as if all were there, and its output was wrong, with no error. It now prefills them first."""
    want_a, want_b = prefetch.baseline(deep, prefetch.OTHER, 40), prefetch.baseline(deep, prefetch.PROMPT, 8)
    config = SchedulerConfig(staged_prefill_attention=BOUND)
    engine, a = prefetch.decoding_beside_disk_pages(deep, tmp_path, 40, scheduler_config=config)
    with engine:
        b = engine._request(prefetch.PROMPT, 8, ignore_eos=True)
        engine.scheduler.add(b)
        for _ in range(300):
            prefetch.step(engine)
            if len(b.output_ids) == 3:
                break
        assert len(b.output_ids) == 3 and b in engine.scheduler.decoding
        engine.scheduler._preempt(b)
        assert engine.tiers.disk.flush(30)
        engine.cache.evict(engine.cache.evictable_blocks)  # B's pages only on disk now
        calls = []

        def fail_first(*args) -> None:
            calls.append(len(calls))
            if len(calls) == 1:
                raise RuntimeError("injected: a layer copy failed")
            copy_pages(*args)

        monkeypatch.setattr(layered_load, "copy_pages", fail_first)
        prefetch.run_out(engine)
        prefetch.assert_clean(engine)
        assert calls, "B's load was not deferred"
        assert b.kv.preemptions == 1 and b.error is None and engine.stats.tiers.disk_failed_reads == 1
    assert list(a.output_ids) == want_a and list(b.output_ids) == want_b
