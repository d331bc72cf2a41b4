"""With page_size > 1 keys are whole pages: matches round down, splits fall on page boundaries, tails stay held."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from radixcache import RadixCache

P = 4


def put(cache: RadixCache, tokens: Sequence[int]) -> list[int]:
    blocks = cache.allocate(-(-len(tokens) // cache.page_size))
    cache.insert(tokens, blocks)
    return blocks


@pytest.fixture
def paged() -> RadixCache:
    return RadixCache(16, page_size=P)


def test_match_is_rounded_down_to_whole_pages(paged: RadixCache) -> None:
    blocks = put(paged, list(range(8)))

    assert paged.match_prefix(list(range(7))).length == 4
    assert paged.match_prefix(list(range(7))).blocks == blocks[:1]
    assert paged.match_prefix([0, 1, 2, 3, 4, 5, 9, 9]).length == 4
    assert paged.match_prefix([0, 1, 2]).length == 0
    assert paged.match_prefix([0, 1, 2, 3, 4, 5, 6, 7, 8]).blocks == blocks


def test_mismatch_inside_the_first_page_matches_nothing(paged: RadixCache) -> None:
    put(paged, [1, 1, 1, 1, 2, 2, 2, 2])

    assert paged.match_prefix([1, 1, 1, 0, 2, 2, 2, 2]).length == 0


def test_match_splits_only_at_a_page_boundary(paged: RadixCache) -> None:
    blocks = put(paged, list(range(12)))

    m = paged.match_prefix([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 99, 99])  # diverges in the middle of page 2

    assert m.length == 8
    assert m.blocks == blocks[:2]
    assert sorted(len(node.key) for node in paged.iter_nodes()) == [4, 8]
    assert all(len(node.key) % P == 0 for node in paged.iter_nodes())
    paged.check_invariants()


def test_insert_diverging_inside_a_page_adds_that_whole_page_as_a_sibling(paged: RadixCache) -> None:
    first = put(paged, [0, 1, 2, 3, 4, 5, 6, 7])
    other = paged.allocate(2)

    already = paged.insert([0, 1, 2, 3, 4, 5, 9, 9], other)

    assert already == 4
    assert paged.match_prefix([0, 1, 2, 3, 4, 5, 6, 7]).blocks == first
    assert paged.match_prefix([0, 1, 2, 3, 4, 5, 9, 9]).blocks.tolist() == [first[0], other[1]]
    assert sorted(node.tokens() for node in paged.iter_nodes()) == [
        [0, 1, 2, 3],
        [0, 1, 2, 3, 4, 5, 6, 7],
        [0, 1, 2, 3, 4, 5, 9, 9],
    ]
    assert paged.free_blocks == 16 - 3  # the duplicate of page 0 went back
    paged.check_invariants()


def test_insert_with_an_unaligned_tail_leaves_the_tail_block_with_the_caller(paged: RadixCache) -> None:
    blocks = paged.allocate(3)

    already = paged.insert(list(range(10)), blocks)  # two full pages and two tokens of a third

    assert already == 0
    assert paged.held_blocks == 1
    assert paged.evictable_blocks == 2
    assert paged.match_prefix(list(range(10))).blocks == blocks[:2]
    paged.free([blocks[2]])  # still the caller's: it can be freed
    assert paged.held_blocks == 0
    assert paged.free_blocks == 14
    paged.check_invariants()


def test_insert_shorter_than_a_page_caches_nothing(paged: RadixCache) -> None:
    blocks = paged.allocate(1)

    assert paged.insert([1, 2, 3], blocks) == 0

    assert list(paged.iter_nodes()) == []
    assert paged.held_blocks == 1
    assert paged.stats.inserted_tokens == 0


def test_insert_reports_cached_tokens_in_whole_pages(paged: RadixCache) -> None:
    put(paged, list(range(8)))
    tail = paged.allocate(3)

    assert paged.insert(list(range(10)), paged.match_prefix(list(range(8))).blocks + tail[:1]) == 8
    assert paged.insert([0, 1, 2, 3, 4, 5, 6], tail[1:]) == 4  # page 1 is cached, but only 3 of its tokens given


def test_eviction_trims_whole_pages(paged: RadixCache) -> None:
    put(paged, list(range(12)))

    assert paged.evict(1) == 1

    assert paged.match_prefix(list(range(12))).length == 8
    assert paged.stats.evicted_tokens == P
    assert all(len(node.key) == len(node.blocks) * P for node in paged.iter_nodes())
    paged.check_invariants()
