"""radixcache.tier.recency's RecencyOrder: a run's refresh (`run_to_newest`) against a plain list, and its cost in
stores, which a laid-out run pays per block of consecutive pages, not per page."""

from __future__ import annotations

import random

import pytest

from radixcache.tier.page_tier import PageTier
from radixcache.tier.recency import RecencyOrder


class CountingDict(dict):
    """A dict that counts its item stores."""

    stores = 0

    def __setitem__(self, key: object, value: object) -> None:
        CountingDict.stores += 1
        super().__setitem__(key, value)


def refreshed(order: list[int], keys: list[int]) -> list[int]:
    """The plain list's refresh: the present keys move to the newest end, the first of them last."""
    held = [k for k in keys if k in order]
    return [k for k in order if k not in held] + held[::-1]


@pytest.mark.parametrize("seed", range(40))
def test_run_to_newest_matches_a_plain_list(seed: int) -> None:
    """Keys laid out anywhere (inserted newest or just older than another, as PageTier.store does), refreshed with
    runs that lie together in order, in part, or not at all, with absent keys among them."""
    rng = random.Random(seed)
    order, naive = RecencyOrder(), list[int]()
    for k in range(rng.randint(0, 30)):
        before = rng.choice([None, *naive]) if naive else None
        order.insert(k, before)
        naive.insert(naive.index(before) if before is not None else len(naive), k)
    for _ in range(20):
        if naive and rng.random() < 0.5:  # a stretch of the order, newest first (a laid-out run), cut and extended
            i = rng.randrange(len(naive))
            keys = naive[max(0, i - rng.randint(0, 8)) : i + 1][::-1]
            keys = keys[: rng.randint(0, len(keys))] + rng.sample(range(40), rng.randint(0, 4))
        else:
            keys = rng.sample(range(40), rng.randint(0, 12))
        keys = list(dict.fromkeys(keys))  # a run's pages are distinct (chained hashes)
        order.run_to_newest(keys)
        naive = refreshed(naive, keys)
        assert list(order) == naive
        assert all(order._next[order._prev[k]] == k for k in order._prev)  # the two links agree


def test_a_laid_out_run_is_refreshed_in_stores_per_block_not_per_page() -> None:
    """A run of 1,000 pages stored over commits (each just older than the page before it), behind other pages, then
    refreshed from its head (a lookup that finds it): a constant number of stores. A move a page took 6,000 (the
    tiers' bookkeeping was about 1.7x an OrderedDict's on the simulator's Mooncake replay: docs/tiers.md)."""
    tier = PageTier(2000)
    run = [i.to_bytes(16, "big") for i in range(1000)]
    lru = tier._lru
    lru._next, lru._prev = CountingDict(lru._next), CountingDict(lru._prev)
    parent = None
    for page in run:
        assert tier.store(page, parent) is not None
        parent = page
    for i in range(500):
        assert tier.store((10**6 + i).to_bytes(16, "big")) is not None  # newer pages
    CountingDict.stores = 0
    assert tier.count_prefix([page[:8] + page[8:] for page in run]) == 1000  # equal keys, other objects
    assert CountingDict.stores <= 12
    assert list(lru)[-1000:] == run[::-1]  # the head newest
    tier.check_invariants()
