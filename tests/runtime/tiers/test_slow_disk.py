"""A prefetch let go (its request cancelled, or admitted under `timeout` / `best_effort`) while one of its page reads
is slow keeps its staging until that read returns. The next prefetch, queued behind it over the staging bound, used
to wait for that staging on the engine loop (up to 0.5 s: every stream stalled), then gave up and recomputed its
pages, logging an allocation error; it now waits queued, the loop stepping on, and starts at a later step once the
staging is back. The slow read is a reader held at a gate the test opens (orderings, never wall time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.tiers.test_prefetch import PROMPT, Gate, assert_clean, baseline, ids, restarted, run_out, written


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=11)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def test_a_cancel_during_a_slow_read_leaves_the_next_prefetch_queued_then_read(model, tmp_path: Path) -> None:
    """A's and B's 10 disk pages each, a pool (and so a staging bound) of 12 pages: B's prefetch is queued behind A's.
    A is cancelled while its readers are held mid-page: the cancel returns with B still queued and unfailed (before:
    it waited 0.5 s for A's staging, then failed B's prefetch), and once the reads go on B loads all its pages."""
    second = ids(42, 3)
    want = baseline(model, second, 3)
    written(model, tmp_path, PROMPT, second)
    engine = restarted(model, tmp_path, capacity_blocks=12, prefetch_policy="wait_complete")
    reader = engine.tiers.reader
    gate = Gate(engine)
    a, b = engine._request(PROMPT, 3, ignore_eos=True), engine._request(second, 3, ignore_eos=True)
    engine.scheduler.add(a)
    engine.scheduler.add(b)
    assert gate.entered.wait(30) and len(reader._queued) == 1
    queued = reader._queued[0]
    assert engine.scheduler.abort(a) and a.finish_reason == "cancelled"
    assert list(reader._queued) == [queued] and queued.failed_at is None and queued.started is None
    gate.opened.set()
    run_out(engine)
    assert b.error is None and b.output_ids == want
    tiers = engine.stats.tiers
    assert (tiers.disk_loaded_pages, tiers.disk_failed_reads) == (10, 0)
    assert_clean(engine)
    engine.close()


def test_a_read_that_stays_slow_fails_the_queued_prefetch_without_holding_the_loop(model, tmp_path: Path) -> None:
    """As above, but A's held reads do not return while B waits: past `pace_wait_s` (0 here) B's prefetch gives up,
    its request recomputes its pages (a failed read counted) and runs to its end with A's reads still held."""
    second = ids(42, 3)
    want = baseline(model, second, 3)
    written(model, tmp_path, PROMPT, second)
    engine = restarted(model, tmp_path, capacity_blocks=12, prefetch_policy="wait_complete")
    reader = engine.tiers.reader
    reader.pace_wait_s = 0.0  # the wait for a let-go job's staging is over at once: B gives up at its next start
    gate = Gate(engine)
    a, b = engine._request(PROMPT, 3, ignore_eos=True), engine._request(second, 3, ignore_eos=True)
    engine.scheduler.add(a)
    engine.scheduler.add(b)
    assert gate.entered.wait(30) and len(reader._queued) == 1
    assert engine.scheduler.abort(a)
    run_out(engine)  # A's reads still held: B runs to its end, its pages recomputed
    assert b.output_ids == want
    gate.opened.set()
    run_out(engine)
    assert b.error is None and b.output_ids == want
    assert engine.stats.tiers.disk_failed_reads == 1
    assert_clean(engine)
    engine.close()
