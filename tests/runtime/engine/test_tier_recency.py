"""The lower tiers' recency follows the requests' use of pages, wherever they are served from: a shared prefix hit on
the device every request stays in a host tier at its size limit, and a run of pages is evicted from its tail."""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest

from radixcache.page_hash import PageChain
from radixcache.runtime import Engine
from radixcache.runtime.kv.tier.disk_stamps import OwedRefreshes
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model
from radixcache.tier.page_tier import PageTier

P = 4


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=5)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def test_a_shared_prefix_hit_on_the_device_stays_in_a_full_host_tier(model: RandomModel) -> None:
    """The host tier's LRU saw only its own hits: a system prompt every request hit on the device was stored once,
    first, so a host tier at its limit evicted exactly those pages (under the other requests' newer ones), and a
    device that let them go later found them nowhere."""
    rng = random.Random(7)
    vocab = model.config.vocab_size
    system = [rng.randrange(1, vocab) for _ in range(6 * P)]
    prompts = [system + [rng.randrange(1, vocab) for _ in range(10)] for _ in range(12)]
    host_pages = 30  # each request adopts ~4 pages of its own: about 50 in all, over the limit
    host_bytes = host_pages * P * model.config.kv_bytes_per_token(4)
    with Engine(model, capacity_blocks=400, page_size=P, host_kv_memory=host_bytes) as engine:
        for prompt in prompts:
            engine.generate(prompt, 6, ignore_eos=True)
        tiers = engine.tiers
        host = tiers.host
        assert host is not None and host.stats.evicted > 0
        hashes = tiers.chain(None).upto(system, len(system) // P)
        assert [h in host for h in hashes] == [True] * len(hashes)
        assert engine.stats.tiers.device_hit_tokens >= 11 * len(system)


def test_a_host_tier_evicts_a_run_from_its_tail() -> None:
    """count_prefix and touch refreshed a run head first, so its head was the least recently used of its pages and
    went first, leaving pages no prefix match reaches."""
    tier = PageTier(4)
    run = [b"a", b"b", b"c"]
    for h in run:
        tier.store(h)
    assert tier.count_prefix(run) == 3
    tier.store(b"x")
    tier.store(b"y")  # evicts one page of the run
    assert [h in tier for h in run] == [True, True, False]
    tier.touch([b"a", b"b"])
    tier.store(b"z")
    assert [h in tier for h in (b"a", b"b", b"x")] == [True, True, False]


def test_a_disk_at_its_limit_keeps_a_new_runs_head_not_its_tail(model: RandomModel, tmp_path: Path) -> None:
    """A run's pages were queued head first, so its head was the oldest page on disk: a disk at its size limit deleted
    the head and kept the pages behind it, which no prefix match reaches (a restart found nothing). Queued tail first,
    the head is the newest and the limit takes the tail."""
    rng = random.Random(3)
    prompt = [rng.randrange(1, model.config.vocab_size) for _ in range(10 * P)]
    kwargs = {"capacity_blocks": 400, "page_size": P, "cache_dir": tmp_path}
    with Engine(model, **kwargs) as probe:  # one page file's size, for a limit of 6 pages
        probe.generate(prompt[:P], 1)
        assert probe.flush(30)
    page_bytes = max(p.stat().st_size for p in tmp_path.rglob("*.kvpage"))
    shutil.rmtree(tmp_path)
    with Engine(model, **kwargs, cache_dir_size=6 * page_bytes) as first:
        want = first.generate(prompt, 1)
        assert first.flush(30)
    assert len(list(tmp_path.rglob("*.kvpage"))) == 6
    with Engine(model, **kwargs, cache_dir_size=6 * page_bytes) as restarted:
        got = restarted.generate(prompt, 1)
    assert got.token_ids == want.token_ids
    assert got.cached_tokens == 6 * P  # the run's first 6 pages, off the disk


def test_a_full_write_queue_keeps_a_runs_head(model: RandomModel, tmp_path: Path) -> None:
    """Queued tail first, a queue with room for 4 of a run's 10 pages would hold its last 4, unreadable without their
    head: the run is cut to what fits, from its head."""
    rng = random.Random(4)
    prompt = [rng.randrange(1, model.config.vocab_size) for _ in range(10 * P)]
    with Engine(model, capacity_blocks=400, page_size=P, cache_dir=tmp_path) as first:
        disk = first.tiers.disk
        disk.max_pending = disk._queue.max_pending = 4
        first.generate(prompt, 1)
        assert first.flush(30)
        assert first.stats.tiers.disk_dropped_pages == 6
    with Engine(model, capacity_blocks=400, page_size=P, cache_dir=tmp_path) as restarted:
        assert restarted.generate(prompt, 1).cached_tokens == 4 * P


def test_a_run_read_off_the_disk_keeps_its_head_at_the_size_limit(model: RandomModel, tmp_path: Path) -> None:
    """Reads refresh each page as it is read, head first: a run just loaded off the disk had its head as its least
    recently used page, and the next writes over the size limit deleted it, leaving the pages behind it unreadable.
    The admission refreshes every page it found (device and loaded), the head last."""
    rng = random.Random(5)
    vocab = model.config.vocab_size
    run = [rng.randrange(1, vocab) for _ in range(10 * P)]
    other = [rng.randrange(1, vocab) for _ in range(4 * P)]
    kwargs = {"capacity_blocks": 400, "page_size": P, "cache_dir": tmp_path}
    page_bytes = _page_file_bytes(model, kwargs, run[:P])
    limit = {"cache_dir_size": 12 * page_bytes}
    with Engine(model, **kwargs, **limit) as first:
        want = first.generate(run, 1)
        assert first.flush(30)
    with Engine(model, **kwargs, **limit) as second:
        assert second.generate(run, 1).cached_tokens == 10 * P - 1  # read off the disk
        second.generate(other, 1)  # 4 new pages: 2 over the limit
        assert second.flush(30)
    with Engine(model, **kwargs, **limit) as third:
        got = third.generate(run, 1)
    assert got.token_ids == want.token_ids
    assert got.cached_tokens == 8 * P  # the run's head: its last 2 pages went


def test_pages_read_back_from_the_host_tier_keep_their_head_newest() -> None:
    """Unlocked after their copy up, in page order: the run's head became its least recently used page again."""
    tier = PageTier(4)
    run = [b"a", b"b", b"c"]
    for h in run:
        tier.store(h)
    tier.lock(run)
    tier.unlock(run)
    tier.store(b"x")
    tier.store(b"y")  # evicts one page of the run: its tail
    assert [h in tier for h in run] == [True, True, False]
    tier.check_invariants()


def test_a_run_read_off_the_disk_keeps_its_head_newest_by_mtime_across_a_restart(
    model: RandomModel, tmp_path: Path
) -> None:
    """Each read stamped its page's mtime with the time it was read, head first, so the head of a run just read was
    its oldest page on disk: a restart rebuilds the index by mtime, and a smaller size limit deleted the run's head
    first, leaving pages no prefix match reaches (0 cached tokens). A read's mtime now falls with its place in the
    run, as the in-memory order has it (the head last)."""
    rng = random.Random(6)
    run = [rng.randrange(1, model.config.vocab_size) for _ in range(10 * P)]
    kwargs = {"capacity_blocks": 400, "page_size": P, "cache_dir": tmp_path}
    with Engine(model, **kwargs) as first:
        want = first.generate(run, 1)
        assert first.flush(30)
    pages = sorted(tmp_path.rglob("*.kvpage"))
    assert len(pages) == 10
    page_bytes = max(p.stat().st_size for p in pages)
    for p in pages:  # written long ago, all at once: only the read below orders them
        os.utime(p, ns=(10**18, 10**18))
    with Engine(model, **kwargs) as second:
        assert second.generate(run, 1).cached_tokens == 10 * P - 1  # read off the disk
    with Engine(model, **kwargs, cache_dir_size=6 * page_bytes) as third:
        got = third.generate(run, 1)
    assert got.token_ids == want.token_ids
    assert got.cached_tokens == 6 * P  # the run's first 6 pages


@pytest.mark.parametrize("stalled", [False, True])
def test_a_run_hot_on_the_device_stays_newest_on_disk_across_a_restart(
    model: RandomModel, tmp_path: Path, stalled: bool
) -> None:
    """Device hits refreshed the disk index in memory only (and a prompt the device held whole not at all: its pages
    were never hashed at admission), and a page's mtime was the time the writer got to it: the run every other request
    alternated with looked the oldest on disk, and a restart under a smaller size limit deleted it first (0 cached
    tokens). The hits are settled off the loop thread (hashed, refreshed, their mtimes stamped head newest) in order
    with the writes, each stamped with the time it was queued. `stalled`: the writer writes nothing until the end."""
    rng = random.Random(8)
    vocab = model.config.vocab_size
    run = [rng.randrange(1, vocab) for _ in range(6 * P)]
    others = [[rng.randrange(1, vocab) for _ in range(3 * P)] for _ in range(4)]
    kwargs = {"capacity_blocks": 400, "page_size": P, "cache_dir": tmp_path}
    gate = threading.Event()
    with Engine(model, **kwargs) as first:
        disk = first.tiers.disk
        write_page = disk._write_page
        disk._write_page = lambda write: (gate.wait(), write_page(write))[1]
        if not stalled:
            gate.set()
        want = first.generate(run, 1)
        for other in others:
            first.generate(other, 1)  # newer pages on disk
            assert first.generate(run, 1).cached_tokens == 6 * P - 1  # on the device: the most recently used
        gate.set()
        assert first.flush(30)
    pages = list(tmp_path.rglob("*.kvpage"))
    assert len(pages) == 6 + 4 * 3
    page_bytes = max(p.stat().st_size for p in pages)
    assert all(p.stat().st_size == page_bytes for p in pages)
    with Engine(model, **kwargs, cache_dir_size=6 * page_bytes) as restarted:  # room for 6 pages: the run's
        got = restarted.generate(run, 1)
    assert got.token_ids == want.token_ids
    assert got.cached_tokens == 6 * P - 1


def test_a_deferred_chain_hashes_as_upto_does_and_leaves_the_chain_as_it_is() -> None:
    """The disk refresh's hashes of a prompt the device held whole are computed later, on the writer thread."""
    tokens = list(range(1, 6 * P + 3))
    for known in (0, 2, 6):
        chain = PageChain(b"root", P)
        chain.upto(tokens, known)
        later = chain.deferred(tokens, 6)
        got = later() if callable(later) else later
        assert len(later) == 6
        assert len(chain.hashes) == known
        assert got == PageChain(b"root", P).upto(tokens, 6)


def test_the_refreshes_waiting_for_the_disk_writer_are_bounded_in_pages() -> None:
    """A device hit records its run for the writer thread; with nothing written, repeated hits on a long prompt must
    not hold a copy of its tokens each without bound: past MAX_PAGES the oldest runs go."""
    owed = OwedRefreshes(max_runs=100, max_pages=10)
    for _ in range(5):
        owed.record(PageChain(b"root", P).deferred(list(range(1, 4 * P + 1)), 4))
    assert len(owed) == 2
    owed.record([b"x"] * 50)  # one run larger than the bound still waits, alone
    assert len(owed) == 1
    assert [len(hashes) for _, hashes in owed.take()] == [50]


def test_a_prompt_the_device_holds_whole_stays_newest_in_a_full_host_tier(model: RandomModel) -> None:
    """The host tier's refresh on a device hit took only the page hashes the match had computed, and a prompt the
    device holds whole is not hashed at admission: a hot prompt hit on the device over and over kept the recency of
    its first store, and a host tier at its limit evicted it before a cold prompt stored after it."""
    rng = random.Random(9)
    vocab = model.config.vocab_size
    hot, cold, filler = ([rng.randrange(1, vocab) for _ in range(6 * P)] for _ in range(3))
    host_bytes = 14 * P * model.config.kv_bytes_per_token(4)
    with Engine(model, capacity_blocks=400, page_size=P, host_kv_memory=host_bytes) as engine:
        tiers = engine.tiers
        host = tiers.host
        assert host is not None and host.capacity == 14
        engine.generate(hot, 1)
        engine.generate(cold, 1)
        for _ in range(3):  # whole on the device: the most recently used prompt
            assert engine.generate(hot, 1).cached_tokens == 6 * P - 1
        engine.generate(filler, 1)  # 6 new pages over the 2 slots left: 4 of the 12 older ones go
        assert host.stats.evicted == 4
        hot_hashes = tiers.chain(None).upto(hot, 6)
        cold_hashes = tiers.chain(None).upto(cold, 6)
        assert [h in host for h in hot_hashes] == [True] * 6
        assert [h in host for h in cold_hashes] == [True, True] + [False] * 4  # the cold run's tail went first
        host.check_invariants()


def test_a_device_hits_stamps_reach_the_disk_without_a_write_flush_or_close(model: RandomModel, tmp_path: Path) -> None:
    """Device hits' refreshes were settled by the writer thread around its next write, by flush and by close only:
    with nothing written afterwards, a process killed (kill -9) kept the run's old mtimes, and a restart under a
    smaller size limit deleted the run every request had just hit (0 cached tokens). The writer settles them within
    its SETTLE_S with nothing to write. The directory is copied as the running engine left it, as a kill would."""
    rng = random.Random(10)
    vocab = model.config.vocab_size
    run = [rng.randrange(1, vocab) for _ in range(6 * P)]
    other = [rng.randrange(1, vocab) for _ in range(6 * P)]
    live, killed = tmp_path / "live", tmp_path / "killed"
    kwargs = {"capacity_blocks": 400, "page_size": P}
    with Engine(model, **kwargs, cache_dir=live) as first:
        want = first.generate(run, 1)
        assert first.flush(30)
        first.generate(other, 1)
        assert first.flush(30)
        files = {f for f in live.rglob("*.kvpage")}
        assert len(files) == 12
        for i, f in enumerate(sorted(files)):  # written long ago, the run first: the oldest
            os.utime(f, ns=(10**18 + i, 10**18 + i))
        pages = {first.tiers.disk._index.get(h).path for h in first.tiers.chain(None).upto(run, 6)}
        for i, f in enumerate(sorted(pages)):
            os.utime(f, ns=(10**17 + i, 10**17 + i))
        assert first.generate(run, 1).cached_tokens == 6 * P - 1  # whole on the device: nothing to write
        deadline = time.monotonic() + 30  # a bound on waiting, not a timing assertion
        while time.monotonic() < deadline and min(os.stat(f).st_mtime_ns for f in pages) < 10**18:
            time.sleep(0.01)
        shutil.copytree(live, killed)  # before any flush or close: what a kill -9 leaves
        page_bytes = max(f.stat().st_size for f in files)
    with Engine(model, **kwargs, cache_dir=killed, cache_dir_size=6 * page_bytes) as restarted:
        got = restarted.generate(run, 1)
    assert got.token_ids == want.token_ids
    assert got.cached_tokens == 6 * P - 1


def test_a_run_adopted_in_several_commits_keeps_its_head_at_the_disks_limit(model: RandomModel, tmp_path: Path) -> None:
    """Each commit refreshed only the pages it adopted: a request's decode pages, adopted one commit at a time, each
    became newer than its prompt's head, so a disk at its size limit deleted the prompt's pages first and kept output
    pages no prefix reaches (a restart found 2 of the prompt's 4 pages). Each page is stamped just older than the page
    before it in its run (kv.tier.disk_index `place`)."""
    rng = random.Random(11)
    prompt = [rng.randrange(1, model.config.vocab_size) for _ in range(4 * P)]
    kwargs = {"capacity_blocks": 400, "page_size": P, "cache_dir": tmp_path}
    page_bytes = _page_file_bytes(model, kwargs, prompt[:P])
    limit = {"cache_dir_size": 6 * page_bytes}
    with Engine(model, **kwargs, **limit) as first:
        first.generate(prompt, 4 * P + 1, ignore_eos=True)  # 4 output pages, adopted one by one
        assert first.flush(30)
        tiers = first.stats.tiers
        # every page of the run was offered in its commit: queued, or dropped where the size limit had already taken
        # the page before it (the writer running ahead of the commits; 8fb4498 queues nothing past such a gap)
        assert tiers.disk_queued_pages >= 6 and tiers.disk_queued_pages + tiers.disk_dropped_pages >= 8
    assert len(list(tmp_path.rglob("*.kvpage"))) == 6
    with Engine(model, **kwargs, **limit) as restarted:
        assert restarted.generate(prompt, 1).cached_tokens == 4 * P - 1  # the whole prompt


def test_a_run_adopted_in_several_commits_keeps_its_head_in_a_full_host_tier(model: RandomModel) -> None:
    """The host tier stored each commit's pages head newest, and the prompt's head became older than every decode
    page after it: a full host tier evicted the prompt's pages 2 and 3 and kept decode pages no prefix reaches. Each
    page now goes just older than the page before it: once the tier is full of the run, its next page would be the
    first to go (and take its parent's place), so it is not copied, nor the pages after it (they follow a gap)."""
    rng = random.Random(12)
    prompt = [rng.randrange(1, model.config.vocab_size) for _ in range(4 * P)]
    host_bytes = 6 * P * model.config.kv_bytes_per_token(4)
    with Engine(model, capacity_blocks=400, page_size=P, host_kv_memory=host_bytes) as engine:
        host = engine.tiers.host
        assert host is not None and host.capacity == 6
        result = engine.generate(prompt, 4 * P + 1, ignore_eos=True)  # 4 output pages, adopted one by one
        run = engine.tiers.chain(None).upto([*prompt, *result.token_ids], 8)
        assert (host.stats.stored, host.stats.evicted) == (6, 0)
        assert [h in host for h in run] == [True] * 6 + [False] * 2  # the run's head, and only its tail lost
        host.check_invariants()


def _page_file_bytes(model: RandomModel, kwargs: dict, page: list[int]) -> int:
    """The size of one page's file in `kwargs["cache_dir"]` (a probe engine writes `page`), the directory left empty."""
    with Engine(model, **kwargs) as probe:
        probe.generate(page, 1)
        assert probe.flush(30)
    cache_dir = Path(kwargs["cache_dir"])
    size = max(p.stat().st_size for p in cache_dir.rglob("*.kvpage"))
    shutil.rmtree(cache_dir)
    return size
