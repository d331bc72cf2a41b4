"""Adopted pages handed to the disk writer (kv.tier.disk_queue): each page's file is serialized once, for the size
limit's budget and the queued write alike, and what is written is what a page read checks."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.kv.tier import disk_format, disk_queue, disk_store, load_costs
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

P = 4


@pytest.fixture(scope="module")
def model() -> RandomModel:
    m = tiny_model(seed=5)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def test_each_page_queued_for_the_disk_is_serialized_once(
    model: RandomModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """queue_disk_writes serialized each page's header to budget it against the size limit, then DiskStore.put
    serialized it again (a JSON header, the packed tokens and a copy of the payload, twice per page)."""
    encoded: list[bytes] = []

    def encode_page(page_hash: bytes, *args: object) -> disk_format.PageWrite:
        encoded.append(page_hash)
        return disk_format.encode_page(page_hash, *args)  # type: ignore[arg-type]

    for module in (disk_queue, disk_store):
        monkeypatch.setattr(module, "encode_page", encode_page, raising=False)
    rng = random.Random(1)
    prompt = [rng.randrange(1, model.config.vocab_size) for _ in range(6 * P)]
    kwargs = {"capacity_blocks": 400, "page_size": P, "cache_dir": tmp_path}
    with Engine(model, **kwargs) as first:
        want = first.generate(prompt, 1)
        assert first.flush(30)
        assert first.stats.tiers.disk_queued_pages == 6
    assert len(encoded) == len(set(encoded)) == 6
    with Engine(model, **kwargs) as restarted:
        got = restarted.generate(prompt, 1)
    assert got.token_ids == want.token_ids and got.cached_tokens == 6 * P - 1  # what was written reads back


def test_a_put_refuses_another_pages_encoding(tmp_path: Path) -> None:
    with disk_store.DiskStore(tmp_path, max_bytes=1 << 20) as store:
        other = disk_format.encode_page(b"b" * 16, store.fingerprint, [1, 2], b"xy", {})
        with pytest.raises(ValueError, match="not 6161"):
            store.put(b"a" * 16, [1, 2], b"xy", {}, encoded=other)
        write = disk_format.encode_page(b"a" * 16, store.fingerprint, [1, 2], b"xy", {})
        assert store.put(b"a" * 16, [1, 2], b"xy", {}, encoded=write) and store.flush(30)
        assert store.read(b"a" * 16, [1, 2]) == (b"xy", {})


def test_a_page_readopted_while_its_write_is_queued_is_not_counted_dropped(model: RandomModel, tmp_path: Path) -> None:
    """A page the device evicted and a request computed again while its first write still waited in the queue was put
    again, refused (already queued) and counted in disk_dropped_pages, though it is written: under a small pool and a
    writer behind, the metric said the disk was dropping pages it was not."""
    rng = random.Random(2)
    a, b = ([rng.randrange(1, model.config.vocab_size) for _ in range(6 * P)] for _ in range(2))
    gate = threading.Event()
    with Engine(model, capacity_blocks=10, page_size=P, cache_dir=tmp_path) as engine:
        disk = engine.tiers.disk
        write_page = disk._write_page
        disk._write_page = lambda write: (gate.wait(), write_page(write))[1]
        engine.generate(a, 1)
        engine.generate(b, 1)  # the pool holds one prompt: a's pages leave the device, their writes still queued
        engine.generate(a, 1)  # a's pages computed and adopted again
        gate.set()
        assert engine.flush(30)
        tiers = engine.stats.tiers
    assert (tiers.disk_queued_pages, tiers.disk_dropped_pages) == (12, 0)
    assert len(list(tmp_path.rglob("*.kvpage"))) == 12


def test_a_commit_stops_at_a_gap_where_the_disk_holds_the_page_after_it(model: RandomModel, tmp_path: Path) -> None:
    """Run a, b, c on disk, then a's file gone (deleted as corrupt by a read, another process's eviction). A request
    whose device holds a commits b, c, d after it: b and c were skipped (held) and d queued with c as its parent,
    which the writer found held: d was written past the gap at a, where no lookup from the head reaches it (after a
    restart none of b, c, d is found). As PageTier.store's gap (docs/tiers.md): d is not written, counted dropped."""
    rng = random.Random(2)
    prompt = [rng.randrange(1, model.config.vocab_size) for _ in range(4 * P + 1)]
    with Engine(model, capacity_blocks=400, page_size=P, cache_dir=tmp_path) as engine:
        engine.generate(prompt[: 3 * P + 1], 1)  # pages a, b, c on disk
        assert engine.flush(30)
        disk, chain = engine.tiers.disk, engine.tiers.chain(None)
        a, b, c, d = chain.upto(prompt, 4)
        assert disk.count_prefix([a, b, c]) == 3
        Path(disk._index.get(a).path).unlink()
        assert disk.forget_missing([a]) == 1
        counts = load_costs.TierTally()
        blocks = engine.cache.allocate(3)
        disk_queue.queue_disk_writes(disk, engine.pool, counts, [b, c, d], blocks, prompt[P : 4 * P], parent=a)
        engine.cache.free(blocks)
        assert engine.flush(30)
        assert (counts["disk_queued_pages"], counts["disk_dropped_pages"]) == (0, 1)
        assert not disk.holds(d)  # past the gap: never read
        assert disk.count_prefix([a, b, c, d]) == 0


def test_pages_whose_parent_a_cache_clear_deleted_are_not_written(model: RandomModel, tmp_path: Path) -> None:
    """`radixcache cache clear` on a running engine's directory, then the conversation goes on: its prefix is on the
    device, and the engine's index still lists its pages. Each new page was written with its parent held by that
    index, whose file was gone: the run's head is not on disk, so a restart finds none of them, and they took room
    under the size limit. The writer now checks that a parent's file is there (one lstat a page it writes)."""
    rng = random.Random(3)
    vocab = model.config.vocab_size
    prompt = [rng.randrange(1, vocab) for _ in range(4 * P + 1)]
    kwargs = {"capacity_blocks": 400, "page_size": P, "cache_dir": tmp_path, "dtype": "float64"}
    with Engine(model, capacity_blocks=400, page_size=P, dtype="float64", enable_cache=False) as plain:
        first = plain.generate(prompt, 2, ignore_eos=True)
        longer = [*prompt, *first.token_ids, *(rng.randrange(1, vocab) for _ in range(3 * P))]
        want = plain.generate(longer, 4 * P, ignore_eos=True).token_ids
    with Engine(model, **kwargs) as engine:
        assert engine.generate(prompt, 2, ignore_eos=True).token_ids == first.token_ids
        assert engine.flush(30)
        with disk_store.DiskStore(tmp_path, max_bytes=1 << 30, create=False) as cli:
            assert cli.clear() == 4
        got = engine.generate(longer, 4 * P, ignore_eos=True)  # its prefix from the device, new pages after it
        assert got.token_ids == want and got.cached_tokens >= 4 * P
        assert engine.flush(30)
    assert not list((tmp_path / "pages").rglob("*.kvpage"))  # none past the gap
    with Engine(model, **kwargs) as restarted:
        again = restarted.generate(longer, 4 * P, ignore_eos=True)
    assert again.token_ids == want and again.cached_tokens == 0
