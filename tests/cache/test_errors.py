"""Bad input raises the right RadixCacheError subclass and leaves the cache exactly as it was."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from radixcache import (
    BlockCountError,
    BlockStateError,
    CacheFullError,
    InvalidTokensError,
    LockError,
    PolicyError,
    RadixCache,
    RadixCacheError,
)

CAPACITY = 16


class Busy:
    """A cache with cached, locked and held blocks, and the ids needed to misuse each kind."""

    def __init__(self, page_size: int) -> None:
        p = page_size
        self.p = p
        self.cache = cache = RadixCache(CAPACITY, page_size=p)
        self.a = [1] * p + [2] * p + [3] * p  # three pages, stays unlocked
        self.b = [1] * p + [2] * p + [4] * p  # shares two pages with a, locked
        cache.insert(self.a, cache.allocate(3))
        cache.insert(self.b, [*cache.match_prefix(self.a[: 2 * p]).blocks, *cache.allocate(1)])
        self.locked = cache.match_prefix(self.b)
        cache.lock(self.locked.node)
        self.unlocked = cache.match_prefix(self.a)
        self.held = cache.allocate(3)
        in_tree = {block for node in cache.iter_nodes() for block in node.blocks}
        self.free = sorted(set(range(CAPACITY)) - in_tree - set(self.held))[:2]  # two ids free right now
        assert cache.free_blocks == CAPACITY - 4 - 3
        cache.check_invariants()


@pytest.fixture(params=[1, 4], ids=["page1", "page4"])
def busy(request: pytest.FixtureRequest) -> Busy:
    return Busy(request.param)


def assert_refused(
    busy: Busy,
    state_of: Callable[[RadixCache], dict[str, Any]],
    error: type[RadixCacheError],
    call: Callable[[RadixCache], object],
) -> None:
    before = state_of(busy.cache)
    with pytest.raises(error):
        call(busy.cache)
    assert state_of(busy.cache) == before


def test_every_error_is_a_radix_cache_error() -> None:
    for error in (InvalidTokensError, BlockCountError, BlockStateError, LockError, CacheFullError, PolicyError):
        assert issubclass(error, RadixCacheError)


BAD_TOKENS = {
    "negative": [1, 2, -1],
    "float": [1, 2.0, 3],
    "nan": [float("nan")],
    "string_token": [1, "2"],
    "none": [None],
    "nested": [[1, 2]],
    "too_big": [2**63],
    "a_string": "123",
    "bytes": b"\x01\x02",
    "not_iterable": 7,
}


@pytest.mark.parametrize("tokens", BAD_TOKENS.values(), ids=BAD_TOKENS.keys())
def test_match_with_bad_tokens_raises_invalid_tokens(busy: Busy, state_of: Callable, tokens: Any) -> None:
    assert_refused(busy, state_of, InvalidTokensError, lambda c: c.match_prefix(tokens))


@pytest.mark.parametrize("tokens", BAD_TOKENS.values(), ids=BAD_TOKENS.keys())
def test_insert_with_bad_tokens_raises_invalid_tokens(busy: Busy, state_of: Callable, tokens: Any) -> None:
    assert_refused(busy, state_of, InvalidTokensError, lambda c: c.insert(tokens, busy.held[:1]))


def test_bad_token_after_a_cached_prefix_still_changes_nothing(busy: Busy, state_of: Callable) -> None:
    assert_refused(busy, state_of, InvalidTokensError, lambda c: c.match_prefix([*busy.a, -5]))
    assert_refused(busy, state_of, InvalidTokensError, lambda c: c.insert([*busy.a, 1.5], busy.held[:4]))


@pytest.mark.parametrize("delta", [-1, 1, 2])
def test_insert_with_the_wrong_block_count_raises(busy: Busy, state_of: Callable, delta: int) -> None:
    tokens = [7] * (2 * busy.p)  # two pages
    assert_refused(busy, state_of, BlockCountError, lambda c: c.insert(tokens, busy.held[: 2 + delta]))


def test_insert_with_an_unaligned_tail_but_no_tail_block_raises(state_of: Callable) -> None:
    busy = Busy(4)  # at page_size 1 every length is page-aligned
    tokens = [7] * (busy.p + 1)  # a page and one token: two blocks
    assert_refused(busy, state_of, BlockCountError, lambda c: c.insert(tokens, busy.held[:1]))


def test_freeing_a_block_twice_raises(busy: Busy, state_of: Callable) -> None:
    busy.cache.free(busy.held[:1])
    assert_refused(busy, state_of, BlockStateError, lambda c: c.free(busy.held[:1]))


def test_freeing_the_same_block_twice_in_one_call_raises(busy: Busy, state_of: Callable) -> None:
    assert_refused(busy, state_of, BlockStateError, lambda c: c.free([busy.held[1], busy.held[0], busy.held[1]]))


def test_freeing_a_block_that_is_in_the_tree_raises(busy: Busy, state_of: Callable) -> None:
    assert_refused(busy, state_of, BlockStateError, lambda c: c.free([busy.held[0], busy.unlocked.blocks[-1]]))
    assert_refused(busy, state_of, BlockStateError, lambda c: c.free(busy.locked.blocks[:1]))


def test_freeing_a_free_block_raises(busy: Busy, state_of: Callable) -> None:
    assert_refused(busy, state_of, BlockStateError, lambda c: c.free([busy.held[0], busy.free[0]]))


@pytest.mark.parametrize("block", [-1, CAPACITY, 2.0, "3", None], ids=["negative", "capacity", "float", "str", "none"])
def test_freeing_a_bad_block_id_raises(busy: Busy, state_of: Callable, block: Any) -> None:
    assert_refused(busy, state_of, BlockStateError, lambda c: c.free([busy.held[0], block]))


def test_inserting_a_free_block_raises(busy: Busy, state_of: Callable) -> None:
    tokens = [9] * (2 * busy.p)
    assert_refused(busy, state_of, BlockStateError, lambda c: c.insert(tokens, [busy.held[0], busy.free[0]]))


def test_inserting_a_block_that_belongs_to_another_node_raises(busy: Busy, state_of: Callable) -> None:
    tokens = [9] * (2 * busy.p)
    other = busy.unlocked.blocks[-1]
    assert_refused(busy, state_of, BlockStateError, lambda c: c.insert(tokens, [busy.held[0], other]))


def test_inserting_a_tree_block_at_the_wrong_cached_page_raises(busy: Busy, state_of: Callable) -> None:
    first, second, third = busy.unlocked.blocks
    assert_refused(busy, state_of, BlockStateError, lambda c: c.insert(busy.a, [second, first, third]))


def test_inserting_the_same_block_twice_raises(busy: Busy, state_of: Callable) -> None:
    tokens = [9] * (2 * busy.p)
    assert_refused(busy, state_of, BlockStateError, lambda c: c.insert(tokens, [busy.held[0], busy.held[0]]))


def test_unlocking_below_zero_raises(busy: Busy, state_of: Callable) -> None:
    assert_refused(busy, state_of, LockError, lambda c: c.unlock(busy.unlocked.node))
    busy.cache.unlock(busy.locked.node)
    assert_refused(busy, state_of, LockError, lambda c: c.unlock(busy.locked.node))


def test_allocating_more_than_the_capacity_raises(busy: Busy, state_of: Callable) -> None:
    assert_refused(busy, state_of, CacheFullError, lambda c: c.allocate(CAPACITY + 1))


def test_allocating_more_than_free_plus_evictable_raises_without_evicting(busy: Busy, state_of: Callable) -> None:
    cache = busy.cache
    too_many = cache.free_blocks + cache.evictable_blocks + 1
    assert too_many <= CAPACITY
    assert_refused(busy, state_of, CacheFullError, lambda c: c.allocate(too_many))
    assert cache.stats.evicted_blocks == 0
    assert len(cache.allocate(too_many - 1)) == too_many - 1  # exactly free + evictable still works


@pytest.mark.parametrize(
    "n",
    [-1, 1.5, 1.0, "2", None, True, False],
    ids=["negative", "float", "whole-float", "str", "none", "true", "false"],
)
def test_allocate_and_evict_refuse_a_bad_count(busy: Busy, state_of: Callable, n: Any) -> None:
    assert_refused(busy, state_of, RadixCacheError, lambda c: c.allocate(n))
    assert_refused(busy, state_of, RadixCacheError, lambda c: c.evict(n))


def test_unhashable_namespace_raises_and_changes_nothing(busy: Busy, state_of: Callable) -> None:
    assert_refused(busy, state_of, RadixCacheError, lambda c: c.match_prefix(busy.a, namespace=["x"]))
    assert_refused(busy, state_of, RadixCacheError, lambda c: c.insert([5] * busy.p, busy.held[:1], namespace={}))


def test_unknown_policy_name_raises_policy_error() -> None:
    with pytest.raises(PolicyError):
        RadixCache(4, policy="random")
    with pytest.raises(PolicyError):
        RadixCache(4, policy=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [{"capacity_blocks": 0}, {"capacity_blocks": 2.0}, {"page_size": 0}])
def test_bad_construction_arguments_raise(kwargs: dict[str, Any]) -> None:
    with pytest.raises(RadixCacheError):
        RadixCache(**{"capacity_blocks": 4, **kwargs})


def test_an_insert_refused_in_a_new_namespace_does_not_create_it(busy: Busy, state_of: Callable) -> None:
    page = [5] * busy.p
    assert_refused(busy, state_of, BlockStateError, lambda c: c.insert(page, busy.free[:1], namespace="new"))
    tree_block = busy.unlocked.blocks[:1]
    assert_refused(busy, state_of, BlockStateError, lambda c: c.insert(page, tree_block, namespace=("tenant", 1)))


@pytest.mark.parametrize("bad", [None, "node", 3], ids=["none", "str", "int"])
def test_lock_and_unlock_refuse_what_is_no_node(busy: Busy, state_of: Callable, bad: Any) -> None:
    # None is what lock_prefix returns for an uncached prefix: a LockError naming the argument, not an AttributeError.
    assert_refused(busy, state_of, LockError, lambda c: c.lock(bad))
    assert_refused(busy, state_of, LockError, lambda c: c.unlock(bad))


def test_lock_and_unlock_of_a_match_result_name_its_node(busy: Busy, state_of: Callable) -> None:
    for call in (busy.cache.lock, busy.cache.unlock):
        with pytest.raises(LockError, match=r"MatchResult \(pass its \.node\)"):
            call(busy.unlocked)  # type: ignore[arg-type]
    assert_refused(busy, state_of, LockError, lambda c: c.lock(busy.unlocked))
