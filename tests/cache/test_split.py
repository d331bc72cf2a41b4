"""A match that ends inside a node splits it; handles, blocks and lock counts survive the split."""

from __future__ import annotations

from collections.abc import Sequence

from radixcache import RadixCache


def put(cache: RadixCache, tokens: Sequence[int]) -> list[int]:
    """Allocate one block per page of `tokens`, insert them, and return the blocks."""
    blocks = cache.allocate(-(-len(tokens) // cache.page_size))
    cache.insert(tokens, blocks)
    return blocks


def node_paths(cache: RadixCache) -> set[tuple[int, ...]]:
    return {tuple(node.tokens()) for node in cache.iter_nodes()}


def test_match_ending_inside_a_node_splits_it_at_the_match_point() -> None:
    cache = RadixCache(16)
    blocks = put(cache, [1, 2, 3, 4])
    assert node_paths(cache) == {(1, 2, 3, 4)}

    m = cache.match_prefix([1, 2, 9])

    assert m.length == 2
    assert m.blocks == blocks[:2]
    assert tuple(m.node.tokens()) == (1, 2)
    assert node_paths(cache) == {(1, 2), (1, 2, 3, 4)}
    cache.check_invariants()


def test_split_leaves_the_original_node_object_holding_the_tail() -> None:
    cache = RadixCache(16)
    blocks = put(cache, [1, 2, 3, 4])
    deep = cache.match_prefix([1, 2, 3, 4]).node

    head = cache.match_prefix([1, 2]).node

    assert head is not deep
    assert deep.parent is head
    assert list(deep.key) == [3, 4]
    assert deep.blocks == blocks[2:]
    assert deep.tokens() == [1, 2, 3, 4]
    assert head.blocks == blocks[:2]


def test_handle_taken_before_a_split_still_locks_the_whole_path() -> None:
    cache = RadixCache(16)
    put(cache, [1, 2, 3, 4])
    deep = cache.match_prefix([1, 2, 3, 4]).node
    cache.match_prefix([1, 2, 7])  # splits the node the handle points to

    cache.lock(deep)

    assert cache.locked_blocks == 4
    assert cache.evictable_blocks == 0
    assert cache.evict(10) == 0
    cache.unlock(deep)
    assert cache.evictable_blocks == 4


def test_split_keeps_every_block_at_its_position() -> None:
    cache = RadixCache(16)
    tokens = [5, 6, 7, 8, 9]
    blocks = put(cache, tokens)
    for cut in (4, 1, 2):  # repeated splits of the same span
        assert cache.match_prefix([*tokens[:cut], 0]).blocks == blocks[:cut]
    full = cache.match_prefix([5, 6, 7, 8, 9])
    assert full.length == 5
    assert full.blocks == blocks
    assert node_paths(cache) == {(5,), (5, 6), (5, 6, 7, 8), (5, 6, 7, 8, 9)}
    cache.check_invariants()


def test_splitting_a_locked_node_keeps_the_lock_counts() -> None:
    cache = RadixCache(16)
    put(cache, [1, 2, 3, 4])
    put(cache, [8, 8])
    deep = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(deep)
    before = (cache.free_blocks, cache.evictable_blocks, cache.locked_blocks)

    head = cache.match_prefix([1, 2, 3]).node

    assert (cache.free_blocks, cache.evictable_blocks, cache.locked_blocks) == before
    assert head.lock_ref == 1
    cache.check_invariants()
    cache.unlock(deep)
    assert (cache.evictable_blocks, cache.locked_blocks) == (6, 0)
    cache.check_invariants()


def test_match_ending_on_a_node_boundary_does_not_split() -> None:
    cache = RadixCache(16)
    put(cache, [1, 2, 3, 4])
    put(cache, [1, 2, 5])  # splits at 2 on insert
    paths = node_paths(cache)

    m = cache.match_prefix([1, 2, 6])

    assert m.length == 2
    assert node_paths(cache) == paths


def test_split_leaf_stays_evictable_and_its_head_becomes_internal() -> None:
    cache = RadixCache(16)
    put(cache, [1, 2, 3, 4])
    cache.match_prefix([1, 2])

    # evicting the two tail blocks empties the tail leaf; the head then becomes the only leaf
    assert cache.evict(2) == 2
    assert node_paths(cache) == {(1, 2)}
    assert cache.match_prefix([1, 2, 3, 4]).length == 2
    cache.check_invariants()
