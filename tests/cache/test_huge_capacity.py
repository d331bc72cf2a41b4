"""A cache far larger than its use (a simulator's "infinite" cache): memory and checks grow with the blocks used."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from radixcache import RadixCache


def _script(cache: RadixCache) -> list[tuple]:
    """Inserts, matches, a lock, a partial free and evictions; what each step saw, with the cache checked after."""
    seen: list[tuple] = []
    for tokens in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8, 9, 10], [11, 12]):
        match = cache.match_prefix(tokens)
        cache.lock(match.node)
        new = cache.allocate(len(tokens) // 2 - len(match.blocks))
        cache.insert(tokens, match.blocks + new)
        cache.unlock(match.node)
        seen.append((match.length, list(match.blocks), list(new)))
        cache.check_invariants()
    match = cache.match_prefix([1, 2, 3, 4, 7, 8])
    cache.lock(match.node)
    held = cache.allocate(3)
    cache.free(held[:2])
    cache.check_invariants()
    seen.append((cache.evict(10), cache.evictable_blocks, cache.locked_blocks))
    cache.unlock(match.node)
    cache.free(held[2:])
    seen.append((cache.evict(10), cache.evictable_blocks, cache.locked_blocks))
    cache.check_invariants()
    return seen


@pytest.mark.parametrize("capacity", [2**62, 2**63, 2**70])
def test_a_huge_capacity_behaves_as_a_small_one_and_checks_in_memory(capacity: int) -> None:
    """`RadixCache(2**70)` was taken and `check_invariants` then raised OverflowError; at 2**62 it built a 4 EiB
    bytearray (MemoryError): the check walked every block id of the capacity, not the ids handed out."""
    small, huge = RadixCache(64, page_size=2), RadixCache(capacity, page_size=2)
    assert _script(huge) == _script(small)
    assert huge.capacity_blocks - huge.free_blocks == small.capacity_blocks - small.free_blocks


def _corrupt_free_list_with_a_tree_block(cache: RadixCache) -> None:
    cache._pool._free.append(cache.match_prefix([1, 2]).blocks[0])


def _repeat_a_free_block(cache: RadixCache) -> None:
    cache._pool._free.extend(cache._pool._free[-1:])


def _lose_a_held_block(cache: RadixCache) -> None:
    cache._pool.held += 1


@pytest.mark.parametrize("corrupt", [_corrupt_free_list_with_a_tree_block, _repeat_a_free_block, _lose_a_held_block])
@pytest.mark.parametrize("capacity", [16, 2**70])
def test_the_check_still_finds_a_broken_pool(capacity: int, corrupt: Callable[[RadixCache], None]) -> None:
    cache = RadixCache(capacity, page_size=2)
    cache.insert([1, 2, 3, 4], cache.allocate(2))
    cache.free(cache.allocate(1))
    cache.check_invariants()
    corrupt(cache)
    with pytest.raises(AssertionError):
        cache.check_invariants()
