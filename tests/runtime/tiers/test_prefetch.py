"""Disk pages read ahead of admission (runtime.kv.tier.prefetch): outputs with prefetch equal a no-cache engine's for
disk hits after a restart and for host hits; a request arriving while another decodes is read by the readers while
the other keeps stepping (an injected reader that blocks until the test lets it go: orderings, never wall time);
each stop policy's behaviour; a page that vanishes or is garbled mid-prefetch is recomputed; a cancel during a
prefetch releases everything. The cache's and the host tier's invariants are checked after every step."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.engine.engine_config import EngineConfig
from radixcache.runtime.kv.state import Status
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.conftest import page_path

P = 4  # tokens per page
DTYPE = "float64"  # tiers copy bits: any mismatch with the no-cache engine is a bug, never a near-tie


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=11)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(1, 97, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


PROMPT = ids(42, 1)  # 10 full pages before its last token
OTHER = ids(9, 2)


def baseline(model: RandomModel, prompt: list[int], n: int) -> list[int]:
    with Engine(model, capacity_blocks=200, page_size=P, enable_cache=False, dtype=DTYPE) as engine:
        return list(engine.generate(prompt, max_new_tokens=n, ignore_eos=True).token_ids)


def written(model: RandomModel, cache_dir: Path, *prompts: list[int]) -> None:
    """An engine that served `prompts` and wrote their pages to `cache_dir`, then stopped."""
    with Engine(model, capacity_blocks=200, page_size=P, cache_dir=cache_dir, dtype=DTYPE) as engine:
        for prompt in prompts:
            engine.generate(prompt, max_new_tokens=1)
        assert engine.flush(30)


def restarted(model: RandomModel, cache_dir: Path, **kw) -> Engine:
    kw = {"capacity_blocks": 200, "page_size": P, "cache_dir": cache_dir, "dtype": DTYPE, "load_back": "always", **kw}
    return Engine(model, **kw)  # its staging written ahead as it starts: which buffer a job gets is then known


def decoding_beside_disk_pages(model: RandomModel, cache_dir: Path, tokens: int, steps: int = 2, **kw) -> tuple:
    """A restarted engine (`kw`: its options) whose disk holds PROMPT's pages, and OTHER added and stepped `steps`
    times, decoding `tokens` tokens: the bystander of a disk load. Returns (engine, the OTHER request)."""
    written(model, cache_dir, PROMPT)
    engine = restarted(model, cache_dir, **{"prefetch_policy": "wait_complete", **kw})
    a = engine._request(OTHER, tokens, ignore_eos=True)
    engine.scheduler.add(a)
    step(engine, steps)
    assert a in engine.scheduler.decoding
    return engine, a


class Gate:
    """Wraps the disk store's `read_into`: each read announces itself and waits until the test opens the gate."""

    def __init__(self, engine: Engine) -> None:
        store = engine.tiers.disk
        self._read = store.read_into
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.reads = 0
        store.read_into = self.read  # the instance attribute shadows the method: the readers call this

    def read(self, page_hash: bytes, tokens: list[int], rows: list[memoryview], head: bytearray, *split):
        self.reads += 1
        self.entered.set()
        assert self.opened.wait(30), "the test never opened the gate"
        return self._read(page_hash, tokens, rows, head, *split)


def step(engine: Engine, times: int = 1) -> None:
    """Scheduler steps on this thread, each followed by the invariants of the tree and of the host tier."""
    with torch.inference_mode():
        for _ in range(times):
            engine.scheduler.step()
            engine.cache.check_invariants()
            engine.tiers.check()


def run_out(engine: Engine) -> None:
    for _ in range(2000):
        if not engine.scheduler.has_work():
            return
        step(engine)
    raise AssertionError("the scheduler never finished")


def assert_clean(engine: Engine) -> None:
    c = engine.cache
    c.check_invariants()
    engine.tiers.check()
    assert c.held_blocks == 0 and c.locked_blocks == 0 and not engine.scheduler.has_work()
    assert engine.tiers.host is None or engine.tiers.host.locked_count == 0


@pytest.mark.parametrize("policy", ["wait_complete", "timeout", "best_effort"])
def test_disk_hits_after_a_restart_equal_the_no_cache_output(model, tmp_path: Path, policy: str) -> None:
    want = baseline(model, PROMPT, 6)
    written(model, tmp_path, PROMPT)
    with restarted(model, tmp_path, prefetch_policy=policy) as engine:
        assert list(engine.generate(PROMPT, max_new_tokens=6, ignore_eos=True).token_ids) == want
        tiers = engine.stats.tiers
        if policy != "best_effort":  # the others wait for the pages; best_effort may start before any arrived
            assert tiers.disk_loaded_pages == len(PROMPT[:-1]) // P and tiers.disk_failed_reads == 0
        engine.check()


def test_host_hits_with_a_disk_tier_equal_the_no_cache_output(model, tmp_path: Path) -> None:
    want = baseline(model, PROMPT, 6)
    host = 64 * P * model.config.kv_bytes_per_token(8)
    with restarted(model, tmp_path, host_kv_memory=host, prefetch_policy="wait_complete") as engine:
        engine.generate(PROMPT, max_new_tokens=1)
        assert engine._loop.wait_idle(30)
        engine.cache.evict(engine.cache.evictable_blocks)  # off the device; write_through kept host copies
        assert list(engine.generate(PROMPT, max_new_tokens=6, ignore_eos=True).token_ids) == want
        assert engine.stats.tiers.host_loaded_pages == len(PROMPT[:-1]) // P
        engine.check()


def test_a_request_is_read_while_another_keeps_decoding(model, tmp_path: Path) -> None:
    want_a, want_b = baseline(model, OTHER, 40), baseline(model, PROMPT, 5)
    engine, a = decoding_beside_disk_pages(model, tmp_path, 40, steps=3)
    gate = Gate(engine)
    b = engine._request(PROMPT, 5, ignore_eos=True)
    engine.scheduler.add(b)
    assert gate.entered.wait(30)  # a reader thread is inside B's first read
    before = len(a.output_ids)
    step(engine, 5)
    assert len(a.output_ids) == before + 5  # A stepped five times while B's pages were being read
    assert b in engine.scheduler.waiting and b.kv.status is Status.WAITING and not b.output_ids
    gate.opened.set()
    while b in engine.scheduler.waiting:
        step(engine)
    assert len(a.output_ids) < 40  # B was admitted while A still decoded
    run_out(engine)
    assert a.output_ids == want_a and b.output_ids == want_b
    assert b.kv.cached_tokens == len(PROMPT[:-1]) // P * P and engine.stats.tiers.disk_loaded_pages == 10
    assert_clean(engine)
    engine.close()


def test_best_effort_admits_at_once_with_what_arrived(model, tmp_path: Path) -> None:
    want = baseline(model, PROMPT, 5)
    written(model, tmp_path, PROMPT)
    engine = restarted(model, tmp_path, prefetch_policy="best_effort")
    gate = Gate(engine)
    b = engine._request(PROMPT, 5, ignore_eos=True)
    engine.scheduler.add(b)
    step(engine)
    assert b.kv.status is Status.RUNNING and b.kv.cached_tokens == 0  # nothing had arrived: all recomputed
    gate.opened.set()
    run_out(engine)
    assert b.output_ids == want and engine.stats.tiers.disk_loaded_pages == 0
    assert_clean(engine)
    engine.close()


def test_timeout_zero_admits_at_once_and_a_long_timeout_waits(model, tmp_path: Path) -> None:
    want = baseline(model, PROMPT, 5)
    written(model, tmp_path, PROMPT)
    for timeout_ms, waits in ((0, False), (600_000, True)):
        engine = restarted(model, tmp_path, prefetch_policy="timeout", prefetch_timeout_ms=timeout_ms)
        gate = Gate(engine)
        b = engine._request(PROMPT, 5, ignore_eos=True)
        engine.scheduler.add(b)
        assert gate.entered.wait(30)
        step(engine, 3)
        assert (b in engine.scheduler.waiting) is waits
        gate.opened.set()
        run_out(engine)
        assert b.output_ids == want
        assert b.kv.cached_tokens == (40 if waits else 0)
        assert_clean(engine)
        engine.close()


@pytest.mark.parametrize("fault", ["vanished", "garbled", "raises"])
def test_a_page_that_fails_mid_prefetch_is_recomputed(model, tmp_path: Path, fault: str) -> None:
    want_a, want_b = baseline(model, OTHER, 12), baseline(model, PROMPT, 5)
    engine, a = decoding_beside_disk_pages(model, tmp_path, 12)  # a bystander, decoding throughout
    gate = Gate(engine)
    b = engine._request(PROMPT, 5, ignore_eos=True)
    engine.scheduler.add(b)
    assert gate.entered.wait(30)
    store = engine.tiers.disk
    bad = b.kv.page_chain.upto(PROMPT[:-1], 10)[3]  # the fourth page fails
    path = page_path(store, bad)
    if fault == "vanished":
        path.unlink()
    elif fault == "garbled":
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        read = gate._read

        def failing(page_hash: bytes, tokens: list[int], rows: list[memoryview], head: bytearray, *split):
            if page_hash == bad:
                raise OSError("injected read error")
            return read(page_hash, tokens, rows, head, *split)

        gate._read = failing
    gate.opened.set()
    run_out(engine)
    assert a.output_ids == want_a and b.output_ids == want_b
    assert b.kv.cached_tokens == 3 * P  # the pages before the failed one; the rest recomputed
    assert engine.stats.tiers.disk_loaded_pages == 3 and engine.stats.tiers.disk_failed_reads == 1
    assert_clean(engine)
    engine.close()


def test_a_cancel_during_a_prefetch_releases_everything(model, tmp_path: Path) -> None:
    head = PROMPT[:20]  # 5 pages: on the host after the eviction below; the rest of PROMPT only on disk
    written(model, tmp_path, PROMPT)
    host = 64 * P * model.config.kv_bytes_per_token(8)
    engine = restarted(model, tmp_path, host_kv_memory=host, prefetch_policy="wait_complete")
    engine.generate([*head, 5], max_new_tokens=1)
    assert engine._loop.wait_idle(30)
    engine.cache.evict(engine.cache.evictable_blocks)
    gate = Gate(engine)
    b = engine._request(PROMPT, 5, ignore_eos=True)
    engine.scheduler.add(b)
    assert gate.entered.wait(30)
    assert engine.tiers.host.locked_count == 5  # the host run before the disk pages, held for B
    step(engine, 2)
    assert engine.scheduler.abort(b) and b.finish_reason == "cancelled"
    assert engine.tiers.host.locked_count == 0
    gate.opened.set()
    engine.tiers.reader.close()  # the readers finish the cancelled job's work
    assert_clean(engine)
    engine.close()


def _b_queued_behind_a(model, tmp_path: Path):
    """An engine restarted over A's and B's disk pages, A's prefetch started and held at the gate, B's queued over
    the staging bound behind it; B's tokens as a no-cache engine gives them."""
    second = ids(42, 3)
    want = baseline(model, second, 3)
    written(model, tmp_path, PROMPT, second)
    engine = restarted(model, tmp_path, prefetch_policy="wait_complete")
    reader = engine.tiers.reader
    reader.max_staged_pages = 4  # A's 10 pages start alone; B's wait for them
    gate = Gate(engine)
    a, b = engine._request(PROMPT, 3, ignore_eos=True), engine._request(second, 3, ignore_eos=True)
    engine.scheduler.add(a)
    engine.scheduler.add(b)
    assert gate.entered.wait(30) and len(reader._queued) == 1
    return engine, reader, gate, a, b, want


def test_a_queued_prefetch_that_finds_no_staging_memory_is_recomputed(model, tmp_path: Path) -> None:
    """B's prefetch waits over the staging bound behind A's; A is cancelled, and B's staging cannot be allocated as
    it starts then: the cancel goes through, and B is admitted and recomputes its pages (before: the cancel raised
    B's allocation error, and B waited for ever on a prefetch that never started)."""
    engine, reader, gate, a, b, want = _b_queued_behind_a(model, tmp_path)

    def no_memory(pages: int):
        raise RuntimeError("injected: cannot allocate staging memory")

    reader.buffers.get = no_memory
    assert engine.scheduler.abort(a) and a.finish_reason == "cancelled"
    del reader.buffers.get  # the method again
    gate.opened.set()
    run_out(engine)
    assert b.error is None and b.output_ids == want
    assert engine.stats.tiers.disk_loaded_pages == 0 and engine.stats.tiers.disk_failed_reads == 1
    assert_clean(engine)
    engine.close()


def _no_threads(*args, **kwargs):
    raise RuntimeError("injected: can't start new thread")


def test_a_queued_prefetch_whose_reader_cannot_start_is_recomputed(model, tmp_path: Path) -> None:
    """B's prefetch waits over the staging bound behind A's; A is cancelled, and no reader thread can start for B
    then: the cancel goes through, B recomputes its pages, and nothing of B's job is left counted (before: the
    cancel raised the thread's error, and B's job stayed counted running and staged, its buffer never back)."""
    engine, reader, gate, a, b, want = _b_queued_behind_a(model, tmp_path)
    assert reader._executor is not None
    reader._executor.submit = _no_threads
    assert engine.scheduler.abort(a) and a.finish_reason == "cancelled"
    gate.opened.set()
    run_out(engine)
    assert b.error is None and b.output_ids == want
    assert engine.stats.tiers.disk_loaded_pages == 0 and engine.stats.tiers.disk_failed_reads == 1
    assert_clean(engine)
    assert (reader._active, reader._staged, reader._running) == (0, 0, [])
    assert reader.buffers.kept_bytes > 0, "the staging went back"
    del reader._executor.submit  # the method again, for close
    engine.close()


def test_a_prefetch_whose_reader_cannot_start_leaves_no_count_that_blocks_the_next(model, tmp_path: Path) -> None:
    """No reader thread can start for A's prefetch: A recomputes, and B's, as large as the staging bound, starts
    and is read once threads can start again (before: A's job stayed counted staged, and B waited for ever)."""
    second = ids(42, 3)
    want_a, want_b = baseline(model, PROMPT, 3), baseline(model, second, 3)
    written(model, tmp_path, PROMPT, second)
    with restarted(model, tmp_path, prefetch_policy="wait_complete") as engine:
        reader = engine.tiers.reader
        reader.max_staged_pages = 10
        reader._executor = ThreadPoolExecutor(1)
        reader._executor.submit = _no_threads
        a = engine._request(PROMPT, 3, ignore_eos=True)
        engine.scheduler.add(a)
        run_out(engine)
        del reader._executor.submit
        b = engine._request(second, 3, ignore_eos=True)
        engine.scheduler.add(b)
        run_out(engine)
        assert a.error is None and a.output_ids == want_a and b.error is None and b.output_ids == want_b
        tiers = engine.stats.tiers
        assert (tiers.disk_failed_reads, tiers.disk_loaded_pages) == (1, 10)
        assert_clean(engine)
        assert (reader._active, reader._staged) == (0, 0)


def test_the_prefetch_options_are_validated() -> None:
    assert EngineConfig().prefetch_policy == "timeout" and EngineConfig().prefetch_timeout_ms == 1000.0
    with pytest.raises(ValueError, match="prefetch_policy"):
        EngineConfig(prefetch_policy="eager")
    for bad in (-1, float("nan"), float("inf"), True, "10", 10**400):  # 10**400: no float (an OverflowError later)
        with pytest.raises(ValueError, match="prefetch_timeout_ms"):
            EngineConfig(prefetch_timeout_ms=bad)


def test_a_request_waiting_for_room_counts_its_declined_pages_once(model, tmp_path: Path) -> None:
    """Admission plans the tiers at every step a request finds no room; only the admission that happens counts
    (declined_pages was the pages times the steps waited: 190 for 10 pages)."""
    want = baseline(model, PROMPT, 3)
    written(model, tmp_path, PROMPT)
    engine = restarted(model, tmp_path, load_back="never", capacity_blocks=16)
    a = engine._request(OTHER * 4, 20, ignore_eos=True)  # takes most of the pool while it decodes
    engine.scheduler.add(a)
    step(engine, 2)
    b = engine._request(PROMPT, 3, ignore_eos=True)
    engine.scheduler.add(b)
    step(engine, 5)
    assert b in engine.scheduler.waiting  # no room yet: planned five times
    run_out(engine)
    assert b.output_ids == want
    assert engine.stats.tiers.declined_pages == len(PROMPT[:-1]) // P  # its 10 disk pages, once
    assert_clean(engine)
    engine.close()


def test_pages_cleared_under_a_best_effort_prefetch_are_written_again(model, tmp_path: Path) -> None:
    """`radixcache cache clear` on the directory of a running engine while a prefetch waits on its first read; the
    request is admitted at once (best_effort) and recomputes its pages. The engine's index still listed them (no
    read of theirs had failed), so their recomputed pages were never written again: a restart found 8 of 40 tokens.
    The pages a taken prefetch did not deliver leave the index when their files are gone."""
    want = baseline(model, PROMPT, 4)
    written(model, tmp_path, PROMPT)
    with restarted(model, tmp_path, prefetch_policy="best_effort") as engine:
        gate = Gate(engine)
        b = engine._request(PROMPT, 4, ignore_eos=True)
        engine.scheduler.add(b)
        assert gate.entered.wait(30)
        with DiskStore(tmp_path, max_bytes=1 << 30, create=False) as cli:  # the CLI's store, beside the engine's
            assert cli.clear() == 10
        step(engine)  # admitted with nothing arrived
        assert b.kv.tier_pages == 0
        gate.opened.set()
        run_out(engine)
        assert list(b.output_ids) == want
        assert engine.flush(30)
        assert_clean(engine)
    with restarted(model, tmp_path) as again:
        got = again.generate(PROMPT, max_new_tokens=4, ignore_eos=True)
    assert list(got.token_ids) == want and got.cached_tokens == 40
