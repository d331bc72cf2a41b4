"""insert adopts new pages, frees held duplicates of cached pages, and accepts the tree's own blocks."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from radixcache import BlockStateError, RadixCache


def put(cache: RadixCache, tokens: Sequence[int]) -> list[int]:
    blocks = cache.allocate(-(-len(tokens) // cache.page_size))
    cache.insert(tokens, blocks)
    return blocks


def test_insert_returns_the_tokens_that_were_already_cached() -> None:
    cache = RadixCache(16)
    assert cache.insert([1, 2, 3], cache.allocate(3)) == 0
    assert cache.insert([1, 2, 3, 4, 5], cache.allocate(5)) == 3
    assert cache.insert([1, 2, 9], cache.allocate(3)) == 2
    assert cache.insert([7], cache.allocate(1)) == 0
    assert cache.stats.inserted_tokens == 3 + 2 + 1 + 1


def test_held_duplicates_of_cached_pages_go_back_to_the_free_pool() -> None:
    cache = RadixCache(16)
    original = put(cache, [1, 2, 3])
    again = cache.allocate(5)
    assert cache.free_blocks == 8

    assert cache.insert([1, 2, 3, 4, 5], again) == 3

    assert cache.match_prefix([1, 2, 3, 4, 5]).blocks == original + again[3:]
    assert cache.free_blocks == 11  # the three duplicates came back
    assert cache.held_blocks == 0
    with pytest.raises(BlockStateError):  # they are free now, not the caller's any more
        cache.free(again[:1])
    cache.check_invariants()


def test_duplicates_are_handed_out_again_by_allocate() -> None:
    cache = RadixCache(6)
    put(cache, [1, 2, 3])
    dup = cache.allocate(3)
    cache.insert([1, 2, 3], dup)

    assert sorted(cache.allocate(3)) == sorted(dup)  # exactly the freed ones: nothing had to be evicted
    assert cache.stats.evicted_blocks == 0


def test_passing_the_trees_own_blocks_for_cached_pages_is_fine() -> None:
    cache = RadixCache(16)
    put(cache, [1, 2, 3])
    m = cache.match_prefix([1, 2, 3])
    new = cache.allocate(2)
    free_before = cache.free_blocks

    assert cache.insert([1, 2, 3, 4, 5], m.blocks + new) == 3

    assert cache.free_blocks == free_before
    assert cache.held_blocks == 0
    assert cache.match_prefix([1, 2, 3, 4, 5]).blocks == m.blocks + new
    cache.check_invariants()


def test_tree_blocks_and_held_duplicates_can_be_mixed() -> None:
    cache = RadixCache(16)
    original = put(cache, [1, 2, 3])
    held = cache.allocate(2)

    assert cache.insert([1, 2, 3], [original[0], held[0], held[1]]) == 3

    assert cache.match_prefix([1, 2, 3]).blocks == original
    assert cache.held_blocks == 0
    assert cache.free_blocks == 13


def test_reinserting_a_cached_sequence_changes_no_tree_content(pages_of) -> None:
    cache = RadixCache(16)
    original = put(cache, [4, 5, 6, 7])
    pages = pages_of(cache)

    # ends inside the node: split there (the refresh is the prefix's alone), with the same pages and blocks
    assert cache.insert([4, 5], cache.allocate(2)) == 2

    assert pages_of(cache) == pages
    assert cache.match_prefix([4, 5, 6, 7]).blocks == original
    assert cache.stats.inserted_tokens == 4


def test_insert_below_a_partially_matched_node_splits_it() -> None:
    cache = RadixCache(16)
    original = put(cache, [1, 2, 3, 4])
    branch = cache.allocate(3)

    assert cache.insert([1, 2, 8], branch) == 2

    assert sorted(node.tokens() for node in cache.iter_nodes()) == [[1, 2], [1, 2, 3, 4], [1, 2, 8]]
    assert cache.match_prefix([1, 2, 8]).blocks == original[:2] + branch[2:]
    assert cache.match_prefix([1, 2, 3, 4]).blocks == original
    cache.check_invariants()


def test_insert_under_a_locked_leaf_keeps_the_new_child_evictable() -> None:
    cache = RadixCache(16)
    put(cache, [1, 2])
    node = cache.match_prefix([1, 2]).node
    cache.lock(node)

    cache.insert([1, 2, 3], [*cache.match_prefix([1, 2]).blocks, *cache.allocate(1)])

    assert (cache.evictable_blocks, cache.locked_blocks) == (1, 2)
    assert cache.evict(5) == 1
    assert cache.match_prefix([1, 2, 3]).length == 2
    cache.check_invariants()
