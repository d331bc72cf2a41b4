"""The prefetch readers' pace (runtime.kv.tier.prefetch `PrefetchReader.pace`): while requests decode, the readers
start at most `pages_per_step` page reads between two of the loop's `pace` calls, more when a `timeout` job would
otherwise miss its deadline, and read freely when nothing decodes or with `pages_per_step=0`; a cancel or a close
frees readers waiting for the pace. In the engine: a request read beside a decode gets at most that many pages a
step, and the outputs equal a no-cache engine's. Orderings and counts, never wall time (the one wait below only
gives a broken pace the time to show itself; a correct one passes however slow the machine)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from radixcache.runtime.engine.engine_config import EngineConfig
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.prefetch import PrefetchReader
from radixcache.runtime.kv.tier.prefetch_job import PrefetchJob
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.tiers.stored_pages import stored_pages
from tests.runtime.tiers.test_prefetch import (
    OTHER,
    PROMPT,
    P,
    assert_clean,
    baseline,
    decoding_beside_disk_pages,
    restarted,
    run_out,
    step,
    written,
)

SHAPE = (2, 2, 4, 2, 8)  # layers, K/V, page_size, kv_heads, head_dim
PAGES = 8


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=11)  # test_prefetch's model: its baselines and written pages
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


class Counted:
    """A disk store's `read_into` wrapped to count the reads that started."""

    def __init__(self, disk: DiskStore) -> None:
        self._read = disk.read_into
        self.started = 0
        self._lock = threading.Lock()
        disk.read_into = self.read  # the instance attribute shadows the method: the readers call this

    def read(self, page_hash: bytes, tokens: list[int], rows: list[memoryview], head: bytearray, *split):
        with self._lock:
            self.started += 1
        return self._read(page_hash, tokens, rows, head, *split)


def _reader(tmp_path: Path, **kw) -> tuple[PrefetchReader, DiskStore, PrefetchJob, Counted]:
    disk, job, pool = stored_pages(tmp_path, [torch.full(SHAPE, float(i)) for i in range(PAGES)])
    kw.setdefault("pace_wait_s", 600.0)  # a pace missed by the test's steps would hang rather than pass
    kw.setdefault("window_s", 30.0)  # a pace returns once its reads are done, however slow this machine is now
    reader = PrefetchReader(disk, pool, **kw)  # type: ignore[arg-type]
    return reader, disk, job, Counted(disk)


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.002)


@contextlib.contextmanager
def _reading(tmp_path: Path, decoding: bool, **kw) -> Iterator[tuple[PrefetchReader, PrefetchJob, Counted]]:
    """A reader of PAGES stored pages, its job submitted right after a first `pace(decoding)`; the job released, the
    reader and the store closed on the way out (again: both are idempotent)."""
    reader, disk, job, counted = _reader(tmp_path, **kw)
    try:
        reader.pace(decoding=decoding)
        with torch.inference_mode():
            reader.submit(job)
        yield reader, job, counted
    finally:
        reader.release(job)
        reader.close()
        disk.close(10)


def test_beside_decodes_the_readers_read_the_pace_between_steps_then_read_freely(tmp_path: Path) -> None:
    with _reading(tmp_path, True, policy="wait_complete", pages_per_step=3) as (reader, job, counted):
        time.sleep(0.05)  # submitted after the last pace: during a step no read starts
        assert counted.started == job.finished == 0
        for steps in (1, 2):
            reader.pace(decoding=True)  # before the next step: returns once its 3 reads are done
            assert counted.started == job.finished == 3 * steps and not job.complete
            time.sleep(0.05)  # the step: room for a read past the pace, were the readers to start one
            assert counted.started == 3 * steps
        reader.pace(decoding=True)
        assert job.finished == PAGES  # the last two pages
        reader.pace(decoding=False)  # nothing paced any more: nothing left either
        assert job.complete and job.arrived == PAGES and counted.started == PAGES
        arrived, staging = reader.take(job)
        assert arrived == PAGES and all(bool((staging[:, :, i] == i).all()) for i in range(PAGES))


def test_without_decodes_or_with_pages_per_step_0_the_readers_are_not_paced(tmp_path: Path) -> None:
    for pace, decoding in ((3, False), (0, True)):
        kw = {"policy": "wait_complete", "pages_per_step": pace}
        with _reading(tmp_path / f"{pace}", decoding, **kw) as (_, job, counted):
            _until(lambda j=job: j.complete, f"pace {pace}, decoding {decoding}: the readers stopped")
            assert counted.started == PAGES


def test_a_timeout_job_gets_what_its_deadline_needs_whatever_the_pace(tmp_path: Path) -> None:
    with _reading(tmp_path, True, policy="timeout", timeout_ms=100, pages_per_step=1) as (reader, job, counted):
        reader.pace(decoding=True, now=job.started + 0.001)  # a step: one page (the deadline is far)
        assert job.finished == 1
        # a step of about 50 ms (since the pace above), the deadline 100 ms after the start: the step after this one
        # comes too late, so this one must allow every page left
        reader.pace(decoding=True, now=job.started + 0.05)
        _until(lambda: job.complete, "a deadline's pages were held back by the pace")
        assert counted.started == PAGES


def test_a_cancel_and_a_close_free_readers_waiting_for_the_pace(tmp_path: Path) -> None:
    with _reading(tmp_path, True, policy="wait_complete", pages_per_step=1) as (reader, job, counted):
        reader.pace(decoding=True)  # a step: one page
        assert job.finished == 1
        reader.release(job)  # the readers waiting for the next step skip the job's remaining pages
        _until(lambda: job.finished == PAGES, "readers waiting for the pace never saw the cancel")
        assert counted.started == 1 and job.buffer is None  # the staging went back once the last task was done
        second = PrefetchJob(0, job.hashes, job.tokens, [])
        with torch.inference_mode():
            reader.submit(second)
        reader.pace(decoding=True)  # a step: one page of the second job
        _until(lambda: second.finished >= 1, "the second job's paced page was never read")
        closer = threading.Thread(target=reader.close)
        closer.start()
        closer.join(30)
        assert not closer.is_alive(), "close waited forever on readers waiting for the pace"
        assert counted.started == 2


def test_a_reader_stops_waiting_for_a_step_that_never_comes(tmp_path: Path) -> None:
    kw = {"policy": "wait_complete", "pages_per_step": 1, "pace_wait_s": 0.01}
    with _reading(tmp_path, True, **kw) as (_, job, counted):  # the last step: a loop that then stops stepping
        _until(lambda: job.complete, "the readers kept waiting for a step")
        assert counted.started == PAGES and job.arrived == PAGES


def test_in_the_engine_a_read_beside_a_decode_gets_at_most_the_pace_a_step(model, tmp_path: Path) -> None:
    want_a, want_b = baseline(model, OTHER, 40), baseline(model, PROMPT, 5)
    written(model, tmp_path, PROMPT)
    engine = restarted(model, tmp_path, prefetch_policy="wait_complete", prefetch_pages_per_step=2)
    # A reader stops waiting for a step after pace_wait_s (0.5 s); on a loaded machine a step can take longer, and
    # the pace this test counts would not apply: a step that never comes is another test's case.
    engine.tiers.reader.pace_wait_s = 60.0
    counted = Counted(engine.tiers.disk)
    a = engine._request(OTHER, 40, ignore_eos=True)
    engine.scheduler.add(a)
    step(engine, 2)
    b = engine._request(PROMPT, 5, ignore_eos=True)
    engine.scheduler.add(b)  # its prefetch starts now, before the next step's pace
    steps = 0
    while b in engine.scheduler.waiting:
        assert a in engine.scheduler.decoding
        step(engine)
        steps += 1
        assert counted.started <= 2 * steps + 2  # what the pace allowed, plus the pages read before the first step
    assert steps >= 4  # 10 pages at 2 a step (the readers may have read up to 2 before)
    run_out(engine)
    assert a.output_ids == want_a and b.output_ids == want_b
    assert engine.stats.tiers.disk_loaded_pages == 10
    assert_clean(engine)
    engine.close()


def test_beside_a_decode_a_request_is_chunked_the_step_after_its_load(model, tmp_path: Path) -> None:
    """The copy of its loaded pages and its first chunk fall in two steps of the decode, not both in one."""
    want_a, want_b = baseline(model, OTHER, 30), baseline(model, PROMPT, 5)
    engine, a = decoding_beside_disk_pages(model, tmp_path, 30)
    b = engine._request(PROMPT, 5, ignore_eos=True)
    engine.scheduler.add(b)
    while b in engine.scheduler.waiting:
        step(engine)
    loaded = engine.stats.tiers.disk_loaded_pages
    assert loaded == len(PROMPT[:-1]) // P and b.kv.tree_blocks == 0
    assert b in engine.scheduler.prefilling and b.kv.num_kv == loaded * P  # admitted and loaded; nothing computed
    made = len(a.output_ids)
    step(engine)
    assert len(a.output_ids) == made + 1 and (b.kv.num_kv > loaded * P or b.output_ids)  # now its chunk ran
    run_out(engine)
    assert a.output_ids == want_a and b.output_ids == want_b
    assert_clean(engine)
    engine.close()


def test_prefetch_pages_per_step_is_validated() -> None:
    assert EngineConfig().prefetch_pages_per_step == 16 and EngineConfig(prefetch_pages_per_step=0)
    for bad in (-1, True, 1.5, "4"):
        with pytest.raises(ValueError, match="prefetch_pages_per_step"):
            EngineConfig(prefetch_pages_per_step=bad)
