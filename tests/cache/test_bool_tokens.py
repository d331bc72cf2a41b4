"""Bools are refused as tokens: True is an int to Python, and `match_prefix([True, False])` matched (and `insert`
stored) tokens 1 and 0. The refusal names the first bool's position, wherever it is and whatever the input's kind.
So are bools as block ids (`insert`, `free`)."""

from __future__ import annotations

import re
from array import array
from collections import deque

import pytest

from radixcache import RadixCache
from radixcache.errors import BlockStateError, InvalidTokensError
from radixcache.tokens import as_token_array


@pytest.mark.parametrize(
    ("tokens", "first"),
    [
        ([True, False], 0),
        ([5, 0, 1, False], 3),
        ([0, 1, 256, 257, 512, True, False], 5),  # low bytes 0 and 1 that are no bool come first
        ((7, 8, False, True), 2),
        ([*range(2, 600), True], 598),
    ],
)
def test_a_bool_token_is_refused_naming_its_position(tokens: list, first: int) -> None:
    with pytest.raises(InvalidTokensError, match=re.escape(f"token {first} is {tokens[first]!r}")):
        as_token_array(tokens)


def test_ints_that_pack_like_bools_are_tokens() -> None:
    tokens = [1, 0, 256, 257, 1 << 40, (1 << 40) + 1, 0, 1]
    assert list(as_token_array(tokens)) == tokens == list(as_token_array(tuple(tokens)))


def test_an_iterator_of_bools_is_refused_too() -> None:
    with pytest.raises(InvalidTokensError, match="token 1 is True"):
        as_token_array(t for t in (3, True))
    with pytest.raises(InvalidTokensError, match="token 0 is False"):
        as_token_array(deque([False, 4]))
    assert list(as_token_array(x for x in (3, 1, 0))) == [3, 1, 0]
    assert list(as_token_array(array("i", [1, 0, 5]))) == [1, 0, 5] == list(as_token_array(deque([1, 0, 5])))


def test_match_prefix_and_insert_refuse_bools_and_change_nothing() -> None:
    cache = RadixCache(8, page_size=2)
    blocks = cache.allocate(1)
    cache.insert([1, 0], blocks)
    before = (cache.cached_tokens, cache.free_blocks, cache.stats.queries)
    with pytest.raises(InvalidTokensError, match="token 0 is True"):
        cache.match_prefix([True, False])
    with pytest.raises(InvalidTokensError, match="token 1 is False"):
        cache.insert([1, False, 3, 4], [*blocks, *cache.allocate(1)])
    assert cache.match_prefix([1, 0]).length == 2
    assert (cache.cached_tokens, cache.stats.queries) == (before[0], before[2] + 1)


@pytest.mark.parametrize("kind", [list, tuple, iter])
def test_bools_are_refused_as_block_ids_and_change_nothing(kind: type) -> None:
    """insert([1, 2], [True]) stored block 1, and free([True]) freed it: True is an int to array() and
    operator.index. Both refuse a bool naming its position, on the fast (leased) path and the exact one."""
    cache = RadixCache(600, page_size=2)
    held = cache.allocate(600)
    assert {0, 1} <= set(held)
    before = (cache.free_blocks, cache.held_blocks, cache.cached_tokens)
    for call, blocks in [
        (lambda b: cache.insert([1, 2], b), [True]),
        (lambda b: cache.insert([1, 2, 3, 4, 5, 6], b), [0, 256, False]),  # low bytes 0 that are no bool first
        (cache.free, [1, 257, True]),
        (cache.free, [False]),
    ]:
        with pytest.raises(BlockStateError, match=re.escape(f"not bools (blocks[{len(blocks) - 1}] is")):
            call(kind(blocks))
        assert (cache.free_blocks, cache.held_blocks, cache.cached_tokens) == before
    assert cache.insert([1, 2, 3, 4], kind([1, 0])) == 0 and cache.cached_tokens == 4  # the ints 1 and 0 are blocks
    cache.free(kind([256, 257]))
    assert cache.free_blocks == 2
    cache.check_invariants()
