"""A disk page read that never returns (a stalled network file system; here a stand-in read that blocks until the
test lets it go) must not hold `Engine.close()` or the process's exit: close waits for the readers a bounded time,
logs the reads it abandons, and returns; the abandoned reader, if its read ever returns, leaves the cache directory
and the store's index sound (a restart reads every page, outputs equal a no-cache engine's). Before, close waited
for the readers for ever (a ThreadPoolExecutor's shutdown), whatever its timeout, and so did the interpreter's exit
(which joins such threads). The same for a flush or close while the refresh of page files' mtimes (a `utime`) never
returns: each returns False by its timeout, and the refresh, once the disk answers, still lands."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from radixcache.runtime.kv.tier import disk_stamps, prefetch
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.conftest import h, page_path, write
from tests.runtime.tiers.test_prefetch import PROMPT, baseline, restarted, written

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=11)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


class HungReads:
    """Wraps the store's `read_into`: each read announces itself, then blocks until `opened` is set."""

    def __init__(self, store: DiskStore) -> None:
        self._read = store.read_into
        self.entered, self.opened = threading.Event(), threading.Event()
        self.threads: list[threading.Thread] = []
        store.read_into = self.read  # the instance attribute shadows the method: the readers call this

    def read(self, *args: object) -> dict | None:
        self.threads.append(threading.current_thread())
        self.entered.set()
        self.opened.wait()
        return self._read(*args)


@pytest.mark.parametrize("timeout", [None, 0.5])
def test_close_returns_while_a_page_read_hangs_and_the_cache_stays_sound(
    model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, timeout: float | None
) -> None:
    monkeypatch.setattr(prefetch, "CLOSE_WAIT_S", 0.5, raising=False)  # close(None): the readers get 0.5 s
    want = baseline(model, PROMPT, 3)
    written(model, tmp_path, PROMPT)
    engine = restarted(model, tmp_path, prefetch_policy="wait_complete")
    reads = HungReads(engine.tiers.disk)
    results: list = []
    asker = threading.Thread(target=lambda: results.append(engine.generate(PROMPT, max_new_tokens=3)), daemon=True)
    asker.start()
    assert reads.entered.wait(30)
    closer = threading.Thread(target=lambda: results.append(engine.close(timeout)), daemon=True)
    with caplog.at_level(logging.WARNING, logger="radixcache.disk"):
        closer.start()
        closer.join(60)  # a hang check, not a timing: before the fix it never returned
        if closer.is_alive():
            reads.opened.set()  # (a failure leaves nothing hung behind it)
        assert not closer.is_alive(), "close() waited for a page read that never returns"
    asker.join(30)
    assert results[0].finish_reason == "cancelled" and results[1] is True
    assert "page read(s) still blocked" in caplog.text
    assert reads.threads and all(t.daemon for t in reads.threads)  # the interpreter's exit does not wait for them
    engine.close()  # again: harmless, and no second wait or warning
    assert caplog.text.count("still blocked") == 1

    reads.opened.set()  # the stalled read comes back after the close: it finishes its page, nothing more
    for thread in reads.threads:
        thread.join(30)
        assert not thread.is_alive()
    report = DiskStore(tmp_path, max_bytes=1 << 30, create=False).verify()
    assert report.corrupt == () and report.ok == report.checked >= 10
    again = restarted(model, tmp_path)
    try:
        assert list(again.generate(PROMPT, max_new_tokens=3, ignore_eos=True).token_ids) == want
        assert again.stats.tiers.disk_loaded_pages == 10 and again.stats.tiers.disk_failed_reads == 0
        again.check()
    finally:
        again.close()


_CHILD = """
import sys, threading
from radixcache.runtime import Engine
from radixcache.runtime.kv.tier import disk_stamps, prefetch
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

prefetch.CLOSE_WAIT_S = 0.5
m = tiny_model(seed=11)
model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
engine = Engine(model, capacity_blocks=200, page_size=4, cache_dir=sys.argv[1], dtype="float64",
                load_back="always", prefetch_policy="wait_complete")
entered = threading.Event()
def hung(*args):
    entered.set()
    threading.Event().wait()  # never returns
engine.tiers.disk.read_into = hung
threading.Thread(target=engine.generate, args=([int(t) for t in sys.argv[2].split(",")],), daemon=True).start()
assert entered.wait(60)
print("reading", flush=True)
"""  # the process exits here, with the read hanging and the engine open: the exit hook closes it


def test_the_process_exits_while_a_page_read_hangs(model, tmp_path: Path) -> None:
    written(model, tmp_path, PROMPT)
    prompt = ",".join(map(str, PROMPT))
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path), prompt], cwd=REPO, capture_output=True, text=True, timeout=120
    )  # a hang check: before the fix the interpreter's exit joined the hung reader for ever (TimeoutExpired)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "reading" and "still blocked" in child.stderr


def test_flush_and_close_return_while_stamping_mtimes_hangs(open_store, monkeypatch, caplog) -> None:
    store = open_store()
    write(store, 0, 1)  # page 1 the newer
    entered, opened = threading.Event(), threading.Event()
    real = disk_stamps.set_mtimes

    def stalled(due):  # a utime on a stalled file system, until the test lets it go
        entered.set()
        opened.wait()
        real(due)

    monkeypatch.setattr(disk_stamps, "set_mtimes", stalled)
    store.refresh([h(0)])  # a device hit: the writer thread settles it within 0.1 s, and stalls there
    assert entered.wait(30)
    results: list[bool] = []
    try:
        for call in (store.flush, store.close):
            caller = threading.Thread(target=lambda call=call: results.append(call(0.2)), daemon=True)
            caller.start()
            caller.join(60)  # a hang check: before the fix each waited for the stalled settle for ever
            assert not caller.is_alive()
    finally:
        opened.set()  # (a failure leaves nothing stalled behind it)
    assert results == [False, False] and "still blocked" in caplog.text
    for thread in threading.enumerate():
        if thread.name in ("radixcache-disk-settle", "radixcache-disk-writer"):
            thread.join(30)
    path0, path1 = page_path(store, h(0)), page_path(store, h(1))
    assert path0.stat().st_mtime_ns > path1.stat().st_mtime_ns  # the refresh landed once the disk answered
