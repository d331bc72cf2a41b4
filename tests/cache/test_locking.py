"""lock/unlock reference-count the whole path to the root and move blocks between evictable and locked."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from radixcache import LockError, RadixCache


def put(cache: RadixCache, tokens: Sequence[int]) -> list[int]:
    blocks = cache.allocate(-(-len(tokens) // cache.page_size))
    cache.insert(tokens, blocks)
    return blocks


def counters(cache: RadixCache) -> tuple[int, int, int]:
    return cache.free_blocks, cache.evictable_blocks, cache.locked_blocks


@pytest.fixture
def forked() -> RadixCache:
    """[1, 2] with two children [3, 4] and [5, 6], and an unrelated [7]: 7 blocks of 10 in the tree."""
    cache = RadixCache(10)
    put(cache, [1, 2, 3, 4])
    put(cache, [1, 2, 5, 6])
    put(cache, [7])
    return cache


def test_lock_moves_the_whole_path_from_evictable_to_locked(forked: RadixCache) -> None:
    node = forked.match_prefix([1, 2, 3, 4]).node
    assert counters(forked) == (3, 7, 0)

    forked.lock(node)

    assert counters(forked) == (3, 3, 4)  # [1, 2] and [3, 4] locked; [5, 6] and [7] still evictable
    forked.check_invariants()


def test_unlock_moves_the_path_back_to_evictable(forked: RadixCache) -> None:
    node = forked.match_prefix([1, 2, 3, 4]).node
    forked.lock(node)

    forked.unlock(node)

    assert counters(forked) == (3, 7, 0)
    forked.check_invariants()


def test_locked_node_and_its_ancestors_survive_evicting_everything(forked: RadixCache) -> None:
    node = forked.match_prefix([1, 2, 3, 4]).node
    forked.lock(node)

    assert forked.evict(100) == 3

    assert forked.match_prefix([1, 2, 3, 4]).length == 4
    assert forked.match_prefix([1, 2, 5, 6]).length == 2  # the unlocked sibling went, the shared parent stayed
    assert forked.match_prefix([7]).length == 0
    assert counters(forked) == (6, 0, 4)
    forked.check_invariants()


def test_locking_a_shared_parent_does_not_protect_its_children(forked: RadixCache) -> None:
    parent = forked.match_prefix([1, 2]).node
    forked.lock(parent)

    assert forked.evict(100) == 5

    assert forked.match_prefix([1, 2, 3, 4]).length == 2
    assert counters(forked) == (8, 0, 2)


def test_two_locks_need_two_unlocks(forked: RadixCache) -> None:
    node = forked.match_prefix([1, 2, 3, 4]).node
    forked.lock(node)
    forked.lock(node)

    forked.unlock(node)
    assert counters(forked) == (3, 3, 4)
    forked.unlock(node)
    assert counters(forked) == (3, 7, 0)


def test_locks_on_two_branches_share_the_parent_count(forked: RadixCache) -> None:
    left = forked.match_prefix([1, 2, 3, 4]).node
    right = forked.match_prefix([1, 2, 5, 6]).node
    forked.lock(left)
    forked.lock(right)
    assert counters(forked) == (3, 1, 6)

    forked.unlock(left)

    assert counters(forked) == (3, 3, 4)  # the parent stays locked through the right branch
    assert forked.evict(100) == 3
    assert forked.match_prefix([1, 2, 5, 6]).length == 4
    forked.check_invariants()


def test_unlock_below_zero_raises_and_changes_nothing(
    forked: RadixCache, state_of: Callable[[RadixCache], dict[str, Any]]
) -> None:
    node = forked.match_prefix([1, 2, 3, 4]).node
    forked.lock(node)
    forked.unlock(node)
    before = state_of(forked)

    with pytest.raises(LockError):
        forked.unlock(node)

    assert state_of(forked) == before


def test_unlocking_an_ancestor_that_was_never_locked_raises(
    forked: RadixCache, state_of: Callable[[RadixCache], dict[str, Any]]
) -> None:
    deep = forked.match_prefix([1, 2, 3, 4]).node
    parent = forked.match_prefix([1, 2]).node
    forked.lock(deep)  # the parent counts this lock, but it was never locked itself
    before = state_of(forked)

    with pytest.raises(LockError):
        forked.unlock(parent)

    assert state_of(forked) == before


def test_locking_an_empty_match_is_a_no_op(forked: RadixCache) -> None:
    miss = forked.match_prefix([9, 9])
    assert miss.length == 0

    forked.lock(miss.node)
    assert counters(forked) == (3, 7, 0)
    forked.unlock(miss.node)
    assert counters(forked) == (3, 7, 0)


def test_parent_becomes_evictable_when_its_last_child_goes() -> None:
    cache = RadixCache(10)
    put(cache, [1, 2, 3])
    cache.match_prefix([1])  # split: [1] -> [2, 3]

    assert cache.evict(2) == 2
    assert cache.match_prefix([1, 2, 3]).length == 1
    assert cache.evict(1) == 1
    assert cache.match_prefix([1, 2, 3]).length == 0
    assert counters(cache) == (10, 0, 0)
    cache.check_invariants()


def test_evicted_node_handle_is_refused_by_lock_and_unlock() -> None:
    cache = RadixCache(4)
    put(cache, [1, 2])
    stale = cache.match_prefix([1, 2]).node
    assert cache.evict(2) == 2

    with pytest.raises(LockError):
        cache.lock(stale)
    with pytest.raises(LockError):
        cache.unlock(stale)
    assert counters(cache) == (4, 0, 0)
    cache.check_invariants()


def test_another_caches_node_is_refused_by_lock_and_unlock(forked: RadixCache) -> None:
    """A handle from another cache (a replica beside this one) must not move this cache's counters, nor the other
    tree's reference counts: both caches stay as they were."""
    other = RadixCache(10)
    put(other, [1, 2, 3, 4])
    foreign = forked.match_prefix([1, 2, 3, 4]).node
    before = counters(forked), counters(other)

    for call in (other.lock, other.unlock):
        with pytest.raises(LockError, match="another cache"):
            call(foreign)
    assert (counters(forked), counters(other)) == before == ((3, 7, 0), (6, 4, 0))
    assert foreign.lock_ref == 0
    forked.check_invariants()
    other.check_invariants()


def test_evicted_handle_stays_refused_after_the_same_tokens_are_cached_again() -> None:
    cache = RadixCache(4)
    put(cache, [1, 2])
    stale = cache.match_prefix([1, 2]).node
    cache.evict(2)
    put(cache, [1, 2])

    with pytest.raises(LockError):
        cache.lock(stale)
    fresh = cache.match_prefix([1, 2]).node
    cache.lock(fresh)
    assert counters(cache) == (2, 0, 2)
