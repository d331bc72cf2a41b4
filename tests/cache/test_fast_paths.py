"""The shortcuts of the hot paths keep the errors of the exact paths.

match_prefix and insert check the signs of an int64 token array only past the tokens their walk finds in the tree
(the tree holds no negative token). These pin down that a bad token is still reported, first and with nothing
changed, wherever it sits, and that arrays and lists give the same results. The last test pins the block pool's
free list to a plain stack: `allocate` hands out exactly the ids it did.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable
from typing import Any

import pytest

from radixcache import BlockStateError, InvalidTokensError, RadixCache
from radixcache.blocks import BlockPool


class Tokens:
    """Two cached sequences sharing two pages, one locked, and some held blocks; tokens as int64 arrays."""

    def __init__(self, page_size: int) -> None:
        p = self.p = page_size
        self.cache = cache = RadixCache(32, page_size=p)
        self.a = [1] * p + [2] * p + [3] * p + [4] * p
        self.b = [1] * p + [2] * p + [5] * p
        cache.insert(self.a, cache.allocate(4))
        cache.insert(self.b, [*cache.match_prefix(self.b[: 2 * p]).blocks, *cache.allocate(1)])
        cache.lock(cache.match_prefix(self.b).node)
        self.held = cache.allocate(8)
        cache.check_invariants()


@pytest.fixture(params=[1, 4], ids=["page1", "page4"])
def setup(request: pytest.FixtureRequest) -> Tokens:
    return Tokens(request.param)


def refused(setup: Tokens, state_of: Callable, call: Callable[[RadixCache], object], message: str) -> None:
    before = state_of(setup.cache)
    with pytest.raises(InvalidTokensError, match=message):
        call(setup.cache)
    assert state_of(setup.cache) == before


def q(tokens: list[int]) -> array:
    return array("q", tokens)


@pytest.mark.parametrize("where", ["first", "in_cached_prefix", "after_cached_prefix", "inside_a_node", "last"])
def test_a_negative_token_in_an_int64_array_is_refused_wherever_it_is(
    setup: Tokens, state_of: Callable, where: str
) -> None:
    p = setup.p
    tokens = [*setup.a, 6, 7, 8]
    index = {
        "first": 0,
        "in_cached_prefix": p,  # the walk stops there: the token cannot equal a cached one
        "after_cached_prefix": 4 * p,
        "inside_a_node": 3 * p + 1 if p > 1 else 3,  # inside a's last node: a match would split it
        "last": len(tokens) - 1,
    }[where]
    tokens[index] = -3
    message = f"token {index} is -3"
    refused(setup, state_of, lambda c: c.match_prefix(q(tokens)), message)
    refused(setup, state_of, lambda c: c.match_prefix(q(tokens), namespace="unseen"), message)
    pages = -(-len(tokens) // p)
    refused(setup, state_of, lambda c: c.insert(q(tokens), setup.held[:pages]), message)
    cached = setup.cache.peek(setup.a).blocks  # the walk finds these, then the lease covers the rest
    refused(setup, state_of, lambda c: c.insert(q(tokens), [*cached, *setup.held[: pages - 4]]), message)


def test_the_first_negative_token_is_the_one_named(setup: Tokens, state_of: Callable) -> None:
    tokens = [*setup.a, 9, -1, 9, -2]
    refused(setup, state_of, lambda c: c.match_prefix(q(tokens)), f"token {len(setup.a) + 1} is -1")


def test_a_bad_token_is_reported_before_bad_blocks(setup: Tokens, state_of: Callable) -> None:
    p = setup.p
    tokens = [*setup.a, -1]
    pages = -(-len(tokens) // p)
    cached = setup.cache.peek(setup.a).blocks
    for blocks in (
        [*cached, 2.0],  # not an int: the fast path hands over to the exact one
        [*cached, setup.held[0], setup.held[1]][: pages + 1],  # the wrong count
        [cached[1], cached[0], *cached[2:], setup.held[0]],  # tree blocks at the wrong pages
    ):
        refused(setup, state_of, lambda c, blocks=blocks: c.insert(q(tokens), blocks), "must be non-negative")


class RaisingEq(int):
    """An int whose comparisons raise: the fast path's block comparison runs the caller's code."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("no comparisons")

    __hash__ = int.__hash__


class RaisingHash:
    def __hash__(self) -> int:
        raise ValueError("no hashing")


def test_a_bad_token_is_reported_before_errors_raised_by_the_callers_objects(setup: Tokens, state_of: Callable) -> None:
    tokens = [*setup.a, -1]
    cached = setup.cache.peek(setup.a).blocks
    blocks = [RaisingEq(cached[0]), *cached[1:], setup.held[0]]
    refused(setup, state_of, lambda c: c.insert(q(tokens), blocks), "must be non-negative")
    refused(setup, state_of, lambda c: c.match_prefix(q(tokens), namespace=RaisingHash()), "must be non-negative")
    refused(setup, state_of, lambda c: c.insert(q(tokens), setup.held[:5], namespace=RaisingHash()), "non-negative")
    with pytest.raises(ValueError, match="no hashing"):  # with good tokens, the namespace's own error, as before
        setup.cache.match_prefix(q(setup.a), namespace=RaisingHash())


@pytest.mark.parametrize("page_size", [1, 4])
def test_int64_arrays_and_lists_give_the_same_results(page_size: int, pages_of: Callable) -> None:
    p = page_size
    caches = [Tokens(p), Tokens(p)]  # driven with int64 arrays, and with lists
    a, b = caches[0].a, caches[0].b
    for tokens in ([*a, 7, 7], b[: 2 * p + 1], [1] * p, [], [*b, *a], [2] * (3 * p)):
        results = []
        for i, setup in enumerate(caches):
            cache = setup.cache
            given = q(tokens) if i == 0 else list(tokens)
            match = cache.match_prefix(given)
            new = cache.allocate(-(-len(tokens) // p) - len(match.blocks))
            results.append((match.length, match.blocks, cache.insert(given, match.blocks + new), new))
        assert results[0] == results[1]
    assert pages_of(caches[0].cache) == pages_of(caches[1].cache)
    assert caches[0].cache.stats == caches[1].cache.stats
    for setup in caches:
        setup.cache.check_invariants()


def test_floats_and_other_non_ints_are_refused_after_a_cached_prefix(setup: Tokens, state_of: Callable) -> None:
    cached = setup.cache.peek(setup.a).blocks
    for bad in (float(cached[-1]), str(cached[-1]), None):
        blocks: list[Any] = [*cached[:-1], bad]
        before = state_of(setup.cache)
        with pytest.raises(BlockStateError, match="must be ints"):
            setup.cache.insert(q(setup.a), blocks)
        assert state_of(setup.cache) == before


@pytest.mark.parametrize("page_size", [1, 4])
def test_block_ids_are_int64_arrays_and_insert_takes_any_sequence_of_ints(page_size: int, pages_of: Callable) -> None:
    p = page_size
    kinds: list[Callable[[array], Any]] = [lambda b: b, list, tuple, lambda b: array("i", b)]
    caches = [Tokens(p) for _ in kinds]
    a, b = caches[0].a, caches[0].b
    for tokens in ([*a, 7, 7], [*b, 9], [8] * (2 * p)):
        results = []
        for convert, setup in zip(kinds, caches, strict=True):
            cache = setup.cache
            match = cache.match_prefix(tokens)
            new = cache.allocate(-(-len(tokens) // p) - len(match.blocks))
            for ids in (match.blocks, new, cache.peek(tokens).blocks):
                assert type(ids) is array and ids.typecode == "q"
            results.append((match.length, match.blocks, cache.insert(tokens, convert(match.blocks + new)), new))
            setup.cache.check_invariants()  # every node's blocks are an int64 array too
        assert all(r == results[0] for r in results)
    assert all(pages_of(setup.cache) == pages_of(caches[0].cache) for setup in caches)


def test_block_ids_outside_int64_are_refused_with_the_range_error(setup: Tokens, state_of: Callable) -> None:
    cached = setup.cache.peek(setup.a).blocks
    for bad in (2**64, -(2**70), -1):
        before = state_of(setup.cache)
        with pytest.raises(BlockStateError, match=f"block {bad} is outside"):
            setup.cache.insert(setup.a, [*cached[:-1], bad])
        with pytest.raises(BlockStateError, match=f"block {bad} is outside"):
            setup.cache.free([bad])
        assert state_of(setup.cache) == before


# ---------------------------------------------------------------------------------------------- the free stack


def test_the_free_stack_of_runs_behaves_as_one_stack() -> None:
    """take/release_held/release_tree against a plain list: the same ids, in the same order, every time."""
    rng = random.Random(7)
    for _ in range(200):
        capacity = rng.choice([1, 5, 40, 300])
        pool = BlockPool(capacity)
        reference = list(range(capacity - 1, -1, -1))  # the free stack, top last
        held: list[int] = []
        tree: list[int] = []
        for _ in range(60):
            op = rng.random()
            if op < 0.4 and reference:
                n = rng.randint(0, len(reference))
                taken = pool.take(n)
                expected = reference[len(reference) - n :][::-1]
                del reference[len(reference) - n :]
                assert taken.tolist() == expected
                if rng.random() < 0.5:  # the tree adopts them (the pool only forgets the lease)
                    pool.adopt(taken[:])
                    tree += taken
                else:
                    held += taken
            elif op < 0.7 and held:
                k = rng.randint(1, len(held))
                back, held = held[-k:], held[:-k]
                pool.release_held(back[:])
                reference += back
            elif tree:
                k = rng.randint(1, len(tree))
                back, tree = tree[-k:], tree[:-k]
                pool.release_tree(back[:])
                reference += back
            assert pool.free_list() == reference
            assert pool.free_count == len(reference)
            assert pool.held == len(held)


def test_a_huge_capacity_costs_memory_for_the_blocks_used_only() -> None:
    """A simulated cache far larger than its trace (`simulate --capacity-blocks 10000000000 --policy lfu`) built a
    free list of every id up front: gigabytes, or the process killed. The ids never handed out are implicit, and
    come out in the order the full stack gives them: 0, 1, 2, ..., after the blocks given back."""
    import tracemalloc

    from radixcache.tier.page_tier import PageTier

    tracemalloc.start()
    cache = RadixCache(10**15, policy="lfu")
    tier = PageTier(10**15)
    cache.insert([1, 2, 3], cache.allocate(3))
    cache.free(cache.allocate(2))  # ids 3 and 4, given back: on top of the stack
    assert list(cache.allocate(3)) == [4, 3, 5]
    assert [tier.store(bytes([i]))[0] for i in range(3)] == [0, 1, 2]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1 << 20
    assert cache.free_blocks == 10**15 - 6 and tier.free_count == 10**15 - 3
    assert cache.evict(10) == 3 and cache.free_blocks == 10**15 - 3
    tier.discard(bytes([1]))
    assert tier.store(b"x") == (1, True)  # the slot given back first
