"""evict(n) and allocate free exactly what is needed, from unlocked leaves only, trimming leaf tails."""

from __future__ import annotations

from collections.abc import Sequence

from radixcache import RadixCache


def put(cache: RadixCache, tokens: Sequence[int]) -> list[int]:
    blocks = cache.allocate(-(-len(tokens) // cache.page_size))
    cache.insert(tokens, blocks)
    return blocks


def test_evict_frees_exactly_n_by_trimming_the_tail_of_a_leaf() -> None:
    cache = RadixCache(8)
    blocks = put(cache, [1, 2, 3, 4, 5])

    assert cache.evict(2) == 2

    m = cache.match_prefix([1, 2, 3, 4, 5])
    assert m.length == 3
    assert m.blocks == blocks[:3]  # the deepest pages went, the front stayed
    assert (cache.free_blocks, cache.evictable_blocks, cache.locked_blocks) == (5, 3, 0)
    cache.check_invariants()


def test_evict_frees_at_most_the_evictable_blocks() -> None:
    cache = RadixCache(8)
    put(cache, [1, 2, 3])
    put(cache, [4, 5])
    cache.lock(cache.match_prefix([4, 5]).node)

    assert cache.evict(100) == 3

    assert cache.evictable_blocks == 0
    assert cache.evict(1) == 0
    assert cache.stats.evicted_blocks == 3
    assert cache.match_prefix([4, 5]).length == 2


def test_evict_zero_does_nothing() -> None:
    cache = RadixCache(8)
    put(cache, [1, 2, 3])

    assert cache.evict(0) == 0
    assert cache.evictable_blocks == 3


def test_evict_spanning_several_leaves_frees_the_exact_total() -> None:
    cache = RadixCache(16)
    put(cache, [1, 1, 1])
    put(cache, [2, 2, 2])
    put(cache, [3, 3, 3])

    assert cache.evict(5) == 5

    remaining = sum(cache.match_prefix([t, t, t]).length for t in (1, 2, 3))
    assert remaining == 4
    assert cache.stats.evicted_blocks == 5
    cache.check_invariants()


def test_allocate_evicts_only_the_shortfall() -> None:
    cache = RadixCache(8)
    put(cache, [1, 2, 3, 4, 5, 6])
    assert cache.free_blocks == 2

    got = cache.allocate(5)

    assert len(set(got)) == 5
    assert cache.stats.evicted_blocks == 3
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).length == 3
    assert (cache.free_blocks, cache.evictable_blocks, cache.locked_blocks) == (0, 3, 5)
    cache.check_invariants()


def test_allocated_blocks_are_never_blocks_still_in_the_tree() -> None:
    cache = RadixCache(6)
    put(cache, [1, 2, 3, 4])
    cached = cache.match_prefix([1, 2, 3, 4])
    cache.lock(cached.node)

    got = cache.allocate(2)

    assert set(got).isdisjoint(cached.blocks)
    assert cache.match_prefix([1, 2, 3, 4]).blocks == cached.blocks


def test_evicting_a_whole_chain_removes_parents_after_their_children() -> None:
    cache = RadixCache(8)
    put(cache, [1, 2, 3, 4])
    put(cache, [1, 2, 5])

    for expected_left in (4, 3, 2, 1, 0):
        cache.evict(1)
        assert cache.evictable_blocks == expected_left
        # whatever is left is still a set of prefixes reachable from the root
        assert all(node.parent is not None for node in cache.iter_nodes())
        cache.check_invariants()
    assert list(cache.iter_nodes()) == []


def test_stats_count_evicted_blocks_and_tokens() -> None:
    cache = RadixCache(8, page_size=2)
    put(cache, [1, 2, 3, 4, 5, 6])

    cache.evict(2)

    assert cache.stats.evicted_blocks == 2
    assert cache.stats.evicted_tokens == 4
