"""The disk tier's order of use for runs that arrive over many commits (kv.tier.disk_index `place`): each new page is
stamped just older than the run's page before it, so a run's head stays last to go at the size limit without the run
being stamped again at each page a request adds (that was quadratic in a run's pages: a utime per page of the run on
the writer thread, and a reorder under the store's lock, at every decode page)."""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.kv.tier import disk_index, disk_stamps
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from tests.runtime.conftest import META, h, payload, toks

P = 4


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=5)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def test_a_long_decode_costs_the_disk_a_bounded_work_per_page(
    model: RandomModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each decode page's commit refreshed the request's whole run on disk: k utimes and a k-page reorder under the
    store's lock at the run's k-th page. Now a page costs its own write (one utime: its mtime) and no reorder; the
    run's head still outlives its tail at the size limit."""
    utimes, restamped = [], []
    real_utime, real_refresh = os.utime, disk_index.PageIndex.refresh
    monkeypatch.setattr(os, "utime", lambda *a, **kw: (utimes.append(a[0]), real_utime(*a, **kw))[1])
    monkeypatch.setattr(
        disk_index.PageIndex,
        "refresh",
        lambda self, hashes, *a: (restamped.extend(hashes), real_refresh(self, hashes, *a))[1],
    )
    rng = random.Random(13)
    prompt = [rng.randrange(1, model.config.vocab_size) for _ in range(2 * P)]
    pages = 2 + 40
    with Engine(model, capacity_blocks=400, page_size=P, cache_dir=tmp_path) as engine:
        engine.generate(prompt, 40 * P + 1, ignore_eos=True)  # 40 output pages, adopted one commit each
        assert engine.flush(30)
        assert engine.stats.tiers.disk_queued_pages == pages
    assert len(utimes) <= 2 * pages  # was about pages**2 / 2
    assert len(restamped) <= pages
    files = sorted(tmp_path.rglob("*.kvpage"), key=lambda f: f.stat().st_mtime_ns)
    assert len(files) == pages
    limit = {"cache_dir_size": 10 * max(f.stat().st_size for f in files)}
    with Engine(model, capacity_blocks=400, page_size=P, cache_dir=tmp_path, **limit) as restarted:
        assert restarted.generate(prompt, 1).cached_tokens == 2 * P - 1  # the head kept: the tail went


class Naive:
    """The order of use as a plain list, least recent first: a run's new page goes just before (older than) the page
    before it in its run (not at all when that one is gone), a run used moves to the end with its head last, a read
    page moves to the end, and the size limit deletes from the front."""

    def __init__(self, limit: int) -> None:
        self.limit, self.order = limit, list[bytes]()

    def put(self, page: bytes, parent: bytes | None) -> None:
        if parent is None:
            self.order.append(page)
        elif parent in self.order:
            self.order.insert(self.order.index(parent), page)
        while len(self.order) > max(1, self.limit):
            self.order.pop(0)

    def refresh(self, run: list[bytes]) -> None:
        held = [p for p in run if p in self.order]
        self.order = [p for p in self.order if p not in held] + held[::-1]

    def read(self, page: bytes) -> None:
        self.order.remove(page)
        self.order.append(page)


@pytest.mark.parametrize("seed", range(4))
def test_the_order_at_the_size_limit_matches_a_naive_reference(
    open_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Runs growing a few pages at a time, device hits on their prefixes and reads, under a size limit of 8 pages:
    the pages kept and their order (in memory, and by mtime after a restart) are the plain list's."""
    clock = itertools.count(10**18, 10**9)  # a second between uses: no two uses' stamps interleave
    monkeypatch.setattr(disk_stamps, "time", SimpleNamespace(time_ns=lambda: next(clock)))
    probe = open_store(directory=tmp_path / "probe")
    probe.put(h(0), toks(0), payload(0), META)
    assert probe.flush(30)
    size = probe.stats().bytes
    store = open_store(max_bytes=8 * size)
    naive = Naive(8)
    rng = random.Random(seed)
    runs = [[h(1000 * r + i) for i in range(12)] for r in range(5)]
    tokens = {h(1000 * r + i): toks(1000 * r + i) for r in range(5) for i in range(12)}
    grown = [0] * len(runs)
    for _ in range(120):
        r = rng.randrange(len(runs))
        run, op = runs[r], rng.random()
        if op < 0.5 and grown[r] < len(run):  # a commit adds 1 to 3 pages
            new = range(grown[r], min(len(run), grown[r] + rng.randint(1, 3)))
            for i in new:
                parent = run[i - 1] if i else None
                assert store.put(run[i], tokens[run[i]], payload(0), META, parent=parent)
                naive.put(run[i], parent)
            grown[r] = new[-1] + 1
        elif op < 0.8 and grown[r]:  # a device hit on a prefix of what it adopted
            hit = run[: rng.randint(1, grown[r])]
            store.refresh(hit)
            naive.refresh(hit)
        elif grown[r] and (page := rng.choice(run[: grown[r]])) in naive.order:
            assert store.read(page, tokens[page]) is not None
            naive.read(page)
        assert store.flush(30)
        assert store._index.order() == naive.order
    s = store.stats()
    assert s.evicted_pages and s.dropped_writes and s.read_hits  # the limit took pages, an orphan was not written
    store.close()
    reopened = open_store()
    assert reopened._index.order() == naive.order  # by mtime


def test_a_run_found_on_disk_and_recomputed_is_used_and_stays_at_the_limit(model: RandomModel, tmp_path: Path) -> None:
    """An admission refreshed the pages it found on the device or loaded, not those found on disk and recomputed
    (load_back declined them: cheaper to compute): a run every request used kept the stamps of its first write, the
    pages its requests added went just older than it, and a restart under a smaller limit deleted it first."""
    rng = random.Random(14)
    used, other = ([rng.randrange(1, model.config.vocab_size) for _ in range(6 * P)] for _ in range(2))
    kwargs = {"capacity_blocks": 400, "page_size": P, "cache_dir": tmp_path}
    with Engine(model, **kwargs) as first:
        want = first.generate(used, 1)
        assert first.flush(30)
        first.generate(other, 1)  # newer on disk
        assert first.flush(30)
    with Engine(model, **kwargs, load_back="never") as second:
        got = second.generate(used, 1)
        assert got.cached_tokens == 0 and second.stats.tiers.declined_pages == 6  # found on disk, recomputed
        assert second.flush(30)
    page_bytes = max(f.stat().st_size for f in tmp_path.rglob("*.kvpage"))
    with Engine(model, **kwargs, cache_dir_size=6 * page_bytes) as restarted:  # room for one run: the one used
        got = restarted.generate(used, 1)
    assert got.token_ids == want.token_ids
    assert got.cached_tokens == 6 * P - 1
