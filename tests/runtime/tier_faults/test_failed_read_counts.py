"""A restart over a cache directory whose page files were damaged (truncated, emptied: a disk that filled or a copy
cut short) serves outputs equal to an engine's without cache, deletes the bad files, and counts the failed reads in
`engine.stats.tiers.disk_failed_reads` (/metrics' radixcache_tier_disk_failed_reads_total), also when the very first
page of the run failed. Until 2026-12-07 that case counted 0: the failed page left the disk index, the admission then
planned no disk load at all, and the prefetch that had found the damage ended uncounted."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

OPTS = {"capacity_blocks": 100, "page_size": 4, "dtype": "float64"}


@pytest.mark.parametrize("damage", ["truncated", "emptied"])
@pytest.mark.parametrize("first", [True, False], ids=["the-run's-first-page", "a-later-page"])
def test_damaged_page_files_are_recomputed_deleted_and_counted(tmp_path: Path, damage: str, first: bool) -> None:
    m = tiny_model(seed=5)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    rng = random.Random(3)
    prompt = [rng.randrange(1, m.config.vocab_size) for _ in range(40)]  # 10 pages of 4
    with Engine(model, enable_cache=False, **OPTS) as plain:
        want = plain.generate(prompt, 4).token_ids
    cache = tmp_path / "kv"
    with Engine(model, cache_dir=cache, **OPTS) as first_run:
        first_run.generate(prompt, 4)
    with Engine(model, cache_dir=cache, **OPTS) as probe:  # which file holds which page of the prompt
        hashes = probe.tiers.chain(None).upto(prompt, 10)
        paths = [Path(probe.tiers.disk.layout.page_path(h)) for h in hashes]
    assert all(p.is_file() for p in paths)
    bad = paths[0] if first else paths[5]
    damaged = bad.read_bytes()[: bad.stat().st_size // 2] if damage == "truncated" else b""
    bad.write_bytes(damaged)
    with Engine(model, cache_dir=cache, load_back="always", **OPTS) as engine:
        got = engine.generate(prompt, 4)
        tiers = engine.stats.tiers
    assert got.token_ids == want
    assert got.cached_tokens == (0 if first else 20)  # the pages before the damaged one
    assert tiers.disk_failed_reads == 1
    assert bad.read_bytes() != damaged  # deleted, and written again as the recomputed page was adopted
    with DiskStore(cache, max_bytes=1 << 30, create=False) as store:
        assert store.verify().corrupt == ()


def test_a_run_with_two_damaged_pages_counts_one_failed_read_not_two(tmp_path: Path) -> None:
    """disk_failed_reads counts failed reads, not pages: a request's disk read stops at the first page that fails
    (that page and every later one of its run are recomputed, the later ones never read), so a run with two damaged
    pages counts 1, and the recomputed pages are not counted in it (docs/tiers.md says so since 2026-12-07; the
    counter's docstring said "pages")."""
    m = tiny_model(seed=5)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    prompt = [random.Random(8).randrange(1, m.config.vocab_size) for _ in range(40)]  # 10 pages of 4
    cache = tmp_path / "kv"
    with Engine(model, cache_dir=cache, **OPTS) as first_run:
        want = first_run.generate(prompt, 4).token_ids
    with Engine(model, cache_dir=cache, **OPTS) as probe:
        paths = [Path(probe.tiers.disk.layout.page_path(h)) for h in probe.tiers.chain(None).upto(prompt, 10)]
    for bad in (paths[3], paths[6]):
        bad.write_bytes(bad.read_bytes()[:20])
    with Engine(model, cache_dir=cache, load_back="always", **OPTS) as engine:
        got = engine.generate(prompt, 4)
        tiers = engine.stats.tiers
    assert got.token_ids == want and got.cached_tokens == 12  # the 3 pages before the first damaged one
    assert (tiers.disk_failed_reads, tiers.disk_loaded_pages) == (1, 3)
