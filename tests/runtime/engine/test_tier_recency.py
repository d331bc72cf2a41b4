"""The lower tiers' recency follows the requests' use of pages, wherever they are served from: a shared prefix hit on
the device every request stays in a host tier at its size limit, and a run of pages is evicted from its tail."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from radixcache.runtime import Engine
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
    with Engine(model, **kwargs) as probe:
        probe.generate(run[:P], 1)
        assert probe.flush(30)
    page_bytes = max(p.stat().st_size for p in tmp_path.rglob("*.kvpage"))
    shutil.rmtree(tmp_path)
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
