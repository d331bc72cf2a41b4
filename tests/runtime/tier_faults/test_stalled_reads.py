"""A disk page read that never returns (a stuck file system; here a stand-in read that blocks until the test lets it
go) is bounded: a prefetch with no page read for `read_timeout_s` ends there, as a failed read, and its request is
admitted and recomputes its pages (the output equals a no-cache engine's), even under `wait_complete`; the reader
threads stuck in those reads are replaced, so the next request's pages are still read from disk. Before, such a
request waited for ever under `wait_complete`, and once every reader thread was stuck no disk page was read again.
The stuck reads, once let go, leave the cache directory sound."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.tiers.test_prefetch import PROMPT, baseline, ids, restarted, written

SECOND = ids(42, 3)


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=11)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


class StuckReads:
    """Wraps the store's `read_into`: the first `stuck` reads block until `opened` is set; later ones read."""

    def __init__(self, store: DiskStore, stuck: int) -> None:
        self._read, self.left = store.read_into, stuck
        self.lock, self.opened = threading.Lock(), threading.Event()
        self.threads: list[threading.Thread] = []
        store.read_into = self.read  # the instance attribute shadows the method: the readers call this

    def read(self, *args: object) -> dict | None:
        with self.lock:
            stuck, self.left = self.left > 0, self.left - 1
        if stuck:
            self.threads.append(threading.current_thread())
            self.opened.wait()
        return self._read(*args)


def _generate(engine, prompt: list[int], reads: StuckReads):
    results: list = []
    asker = threading.Thread(target=lambda: results.append(engine.generate(prompt, 3, ignore_eos=True)), daemon=True)
    asker.start()
    asker.join(60)  # a hang check, not a timing: before the fix it never returned
    if asker.is_alive():
        reads.opened.set()  # (a failure leaves nothing stuck behind it)
    assert not asker.is_alive(), "a request waited for ever for a disk read that never returns"
    return results[0]


def test_a_stuck_page_read_is_recomputed_and_later_requests_still_read_the_disk(model, tmp_path: Path) -> None:
    want = [baseline(model, p, 3) for p in (PROMPT, SECOND)]
    written(model, tmp_path, PROMPT, SECOND)
    engine = restarted(model, tmp_path, prefetch_policy="wait_complete")
    try:
        engine.tiers.reader.read_timeout_s = 0.2
        reads = StuckReads(engine.tiers.disk, stuck=2)  # the first job's two readers, each on its first page
        first = _generate(engine, PROMPT, reads)
        assert list(first.token_ids) == want[0] and first.cached_tokens == 0
        assert engine.stats.tiers.disk_failed_reads == 1 and len(reads.threads) == 2
        second = _generate(engine, SECOND, reads)  # both stuck readers still stuck: replaced
        assert list(second.token_ids) == want[1] and second.cached_tokens == 40
        assert engine.stats.tiers.disk_loaded_pages == 10 and all(t.is_alive() for t in reads.threads)
    finally:
        reads.opened.set()
        engine.close()
    for thread in reads.threads:
        thread.join(30)
        assert not thread.is_alive()
    report = DiskStore(tmp_path, max_bytes=1 << 30, create=False).verify()
    assert report.corrupt == () and report.ok == report.checked >= 20


def test_readers_stuck_on_a_cancelled_request_are_replaced(model, tmp_path: Path) -> None:
    """No prefetch stalls here (the stuck reads' request was cancelled, as best_effort's admission also lets a job go):
    the stuck threads are replaced by the pace before each step, and the next request's pages are read."""
    want = baseline(model, SECOND, 3)
    written(model, tmp_path, PROMPT, SECOND)
    engine = restarted(model, tmp_path, prefetch_policy="wait_complete")
    try:
        reader = engine.tiers.reader
        reader.read_timeout_s = 60.0  # (the cancel comes first)
        reads = StuckReads(engine.tiers.disk, stuck=2)
        first = engine.submit(PROMPT, 3)
        while len(reads.threads) < 2:  # a hang check bounds it: the test's timeout
            threading.Event().wait(0.01)
        first.cancel()
        assert first.result(30).finish_reason == "cancelled"
        threading.Event().wait(0.3)
        reader.read_timeout_s = 0.2  # the reads are stuck from now on, but a fresh job is not
        second = _generate(engine, SECOND, reads)
        assert list(second.token_ids) == want and second.cached_tokens == 40
        assert engine.stats.tiers.disk_loaded_pages == 10
    finally:
        reads.opened.set()
        engine.close()
