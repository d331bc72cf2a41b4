"""The host tier's refreshes from device hits (kv.tier.host_recency): owed until the tier's next use, then applied
in the order the uses happened, each run's head last; a run's hashes computed once for the host and the disk."""

from __future__ import annotations

import pytest

from radixcache.page_hash import PageChain
from radixcache.runtime.kv.tier.host_recency import MAX_OWED, HostPageTier, SharedRun, shared


def _tier(*pages: bytes, capacity: int = 4) -> HostPageTier:
    tier = HostPageTier(capacity)
    for page in pages:
        tier.store(page)
    return tier


def test_an_owed_refresh_takes_its_place_before_the_uses_after_it() -> None:
    tier = _tier(b"a", b"b", b"c", b"x")  # least recently used first
    calls = []
    tier.touch_later(SharedRun(lambda: calls.append(1) or [b"a", b"b"], 2))
    assert calls == []  # nothing hashed while recorded
    tier.touch([b"x"])  # used after the run: newer than it
    tier.store(b"y")
    assert b"c" not in tier
    tier.store(b"z")  # the run's tail before its head, the run before x
    assert [p in tier for p in (b"a", b"b", b"x")] == [True, False, True]
    assert calls == [1]
    tier.check_invariants()


@pytest.mark.parametrize("use", ["count_prefix", "store", "lock", "unlock", "discard", "touch"])
def test_every_use_of_the_tier_applies_the_owed_refreshes_first(use: str) -> None:
    tier = _tier(b"a", b"b", b"c")
    tier.lock([b"c"])
    tier.lock([b"c"])
    tier.touch_later([b"a"])
    {
        "count_prefix": lambda: tier.count_prefix([b"q"]),
        "store": lambda: tier.store(b"d"),
        "lock": lambda: tier.lock([b"c"]),
        "unlock": lambda: tier.unlock([b"c"]),  # locked twice: still locked
        "discard": lambda: tier.discard(b"q"),
        "touch": lambda: tier.touch([]),
    }[use]()
    order = list(tier._lru)
    assert order.index(b"a") > order.index(b"b")
    tier.check_invariants()


def test_the_owed_refreshes_are_bounded() -> None:
    tier = _tier(b"a")
    for _ in range(MAX_OWED + 5):
        tier.touch_later([b"a"])
    assert len(tier._owed) <= MAX_OWED


def test_a_shared_run_is_hashed_once_for_both_tiers() -> None:
    tokens = list(range(1, 13))
    later = PageChain(b"root", 4).deferred(tokens, 3)
    assert callable(later)
    run = shared(later)
    assert len(run) == 3
    first = run()  # type: ignore[operator]
    assert first == PageChain(b"root", 4).upto(tokens, 3)
    assert run() is first  # type: ignore[operator]  # not hashed again
    assert shared([b"a"]) == [b"a"]
