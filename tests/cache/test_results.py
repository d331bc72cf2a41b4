"""Results are plain data: no aliasing between the caller's lists and the tree; stats in tokens; deterministic runs."""

from __future__ import annotations

from array import array

from radixcache import RadixCache
from radixcache.trace.synthetic import multi_turn_chat


def test_mutating_the_callers_lists_after_insert_does_not_change_the_tree() -> None:
    cache = RadixCache(16)
    tokens = [1, 2, 3, 4]
    blocks = cache.allocate(4)
    kept = list(blocks)
    cache.insert(tokens, blocks)

    tokens[1] = 9
    blocks[0] = 15
    tokens.append(5)

    m = cache.match_prefix([1, 2, 3, 4])
    assert m.length == 4
    assert m.blocks.tolist() == kept
    assert cache.match_prefix([1, 9]).length == 1


def test_mutating_a_match_result_does_not_change_the_tree() -> None:
    cache = RadixCache(16)
    cache.insert([1, 2, 3], cache.allocate(3))
    first = cache.match_prefix([1, 2, 3])
    expected = list(first.blocks)

    first.blocks.append(7)
    first.blocks[0] = 99

    assert cache.match_prefix([1, 2, 3]).blocks.tolist() == expected
    cache.check_invariants()


def test_an_int64_array_of_tokens_is_accepted_and_copied() -> None:
    cache = RadixCache(16)
    tokens = array("q", [4, 5, 6])
    cache.insert(tokens, cache.allocate(3))

    tokens[0] = 0

    assert cache.match_prefix([4, 5, 6]).length == 3
    assert cache.match_prefix(array("q", [4, 5])).length == 2
    assert cache.match_prefix(range(4, 7)).length == 3
    assert cache.match_prefix((4, 5, 6)).length == 3


def test_stats_count_queries_and_hits_in_tokens() -> None:
    cache = RadixCache(16, page_size=2)
    cache.insert([1, 2, 3, 4], cache.allocate(2))

    cache.match_prefix([1, 2, 3, 4, 5])  # 4 of 5 hit
    cache.match_prefix([1, 2, 3])  # 2 of 3: rounded down to the page
    cache.match_prefix([7, 7])  # 0 of 2

    stats = cache.stats
    assert (stats.queries, stats.query_tokens, stats.hit_tokens) == (3, 10, 6)
    assert stats.hit_rate == 0.6
    assert stats.inserted_tokens == 4
    cache.reset_stats()
    assert cache.stats.queries == 0


def replay(policy: str) -> list[tuple[int, list[int]]]:
    """Run a small chat workload at a capacity that forces evictions; return every match result."""
    cache = RadixCache(200, page_size=4, policy=policy)
    seen: list[tuple[int, list[int]]] = []
    workload = multi_turn_chat(
        conversations=12, system_prompts=2, system_tokens=60, turns=(2, 4), user_tokens=20, assistant_tokens=30, seed=3
    )
    for request in workload:
        tokens = list(request.tokens)
        m = cache.match_prefix(tokens)
        seen.append((m.length, list(m.blocks)))
        cache.lock(m.node)
        new = cache.allocate(-(-len(tokens) // 4) - len(m.blocks))
        cache.insert(tokens, m.blocks + new)
        cache.unlock(m.node)
    cache.check_invariants()
    assert cache.stats.evicted_blocks > 0
    assert sum(1 for length, _ in seen if length) > len(seen) // 2  # most requests reuse a cached prefix
    return seen


def test_the_same_calls_give_the_same_results_every_time() -> None:
    for policy in ("lru", "cost"):
        assert replay(policy) == replay(policy)


def test_empty_calls_are_harmless() -> None:
    cache = RadixCache(8)
    cache.insert([1, 2], cache.allocate(2))

    assert len(cache.allocate(0)) == 0
    cache.free([])
    assert cache.evict(0) == 0
    assert cache.insert([], []) == 0
    empty = cache.match_prefix([])
    assert (empty.length, empty.blocks.tolist()) == (0, [])
    cache.lock(empty.node)
    cache.unlock(empty.node)

    assert (cache.free_blocks, cache.evictable_blocks, cache.locked_blocks) == (6, 2, 0)
    assert cache.match_prefix([1, 2]).length == 2
    cache.check_invariants()
