"""peek reads the longest cached prefix without touching anything; lock_prefix pins exactly the pages asked for."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from radixcache import RadixCache, RadixCacheError, TreeNode


def put(cache: RadixCache, tokens: Sequence[int], *, namespace: Any = None) -> list[int]:
    blocks = cache.allocate(-(-len(tokens) // cache.page_size))
    cache.insert(tokens, blocks, namespace=namespace)
    return blocks


def node_count(cache: RadixCache) -> int:
    return sum(1 for _ in cache.iter_nodes())


def counters(cache: RadixCache) -> tuple[int, int, int]:
    return cache.free_blocks, cache.evictable_blocks, cache.locked_blocks


def page_meta(cache: RadixCache) -> dict[tuple[Any, tuple[int, ...]], tuple[int, int, int]]:
    """Per cached page: (block, last access, hit count) of the node that holds it. A split keeps all three."""
    p = cache.page_size
    meta = {}
    for node in cache.iter_nodes():
        path = tuple(node.tokens())
        start = len(path) - len(node.key)
        for i, block in enumerate(node.blocks):
            meta[(node.namespace, path[: start + (i + 1) * p])] = (block, node.last_access, node.hit_count)
    return meta


LONG = list(range(100, 164))  # 64 tokens: 16 pages of 4


@pytest.fixture
def paged() -> RadixCache:
    """Page size 4: LONG (16 pages) in one node, [1..8] forking into [9..12] and [13..16]; 20 blocks of 32."""
    cache = RadixCache(32, page_size=4)
    put(cache, LONG)
    put(cache, list(range(1, 13)))
    put(cache, [*range(1, 9), *range(13, 17)])
    return cache


QUERIES = [
    LONG,
    LONG[:10],  # ends inside the long node, mid-page
    LONG[:8] + [0] * 8,  # diverges inside the long node
    list(range(1, 9)),  # ends at the fork
    [*range(1, 13), 0],  # a whole branch and an unaligned tail
    [*range(1, 9), 13, 14, 0, 0],  # diverges inside a branch, mid-page
    [1, 2, 3],  # shorter than a page
    [7, 7, 7, 7],  # nothing cached
    [],
]


# ------------------------------------------------------------------ peek


@pytest.mark.parametrize("query", QUERIES)
def test_peek_finds_the_same_length_and_blocks_as_match_prefix(paged: RadixCache, query: list[int]) -> None:
    peeked = paged.peek(query)
    matched = paged.match_prefix(query)

    assert (peeked.length, peeked.blocks) == (matched.length, matched.blocks)
    if matched.length == 0:
        assert peeked.node.parent is None  # the namespace root
    elif peeked.node is not matched.node:  # the match split peek's node: the head is its new parent
        assert peeked.node.parent is matched.node
    paged.check_invariants()


def test_peek_inside_a_node_returns_that_node_with_only_its_matched_pages(paged: RadixCache) -> None:
    whole = paged.peek(LONG)

    part = paged.peek(LONG[:10])

    assert part.node is whole.node  # the partially matched node itself, not split
    assert part.length == 8 and part.blocks == whole.blocks[:2]
    assert len(part.node.blocks) == 16


@pytest.mark.parametrize("query", QUERIES)
def test_peek_changes_nothing(
    paged: RadixCache, query: list[int], state_of: Callable[[RadixCache], dict[str, Any]]
) -> None:
    before = state_of(paged)  # stats, nodes with their access times and hit counts, clock, namespaces
    heap = list(paged._evictable_leaves)  # private read: the evictable set's entries

    paged.peek(query)

    assert state_of(paged) == before
    assert paged._evictable_leaves == heap


def test_peek_changes_no_stats(paged: RadixCache) -> None:
    paged.match_prefix(LONG[:4])
    before = paged.stats

    for query in QUERIES:
        paged.peek(query)

    assert paged.stats == before


def test_peek_ending_inside_a_node_splits_nothing(paged: RadixCache) -> None:
    nodes = node_count(paged)

    assert paged.peek(LONG[:12]).length == 12

    assert node_count(paged) == nodes
    assert paged.match_prefix(LONG[:12]).length == 12
    assert node_count(paged) == nodes + 1  # where match_prefix does split


@pytest.mark.parametrize(("read", "evicted"), [("peek", [1, 2]), ("match_prefix", [3, 4])])
def test_peek_does_not_save_a_leaf_from_lru_eviction_where_a_match_does(read: str, evicted: list[int]) -> None:
    cache = RadixCache(8, policy="lru")
    put(cache, [1, 2])  # older
    put(cache, [3, 4])

    getattr(cache, read)([1, 2])
    assert cache.evict(2) == 2

    assert cache.peek(evicted).length == 0
    kept = [3, 4] if evicted == [1, 2] else [1, 2]
    assert cache.peek(kept).length == 2


def test_peek_under_an_unknown_namespace_creates_no_root(paged: RadixCache) -> None:
    before = paged.namespaces()

    result = paged.peek(LONG, namespace="nobody")

    assert result.length == 0 and len(result.blocks) == 0
    assert result.node.parent is None and result.node.namespace == "nobody"
    assert paged.namespaces() == before
    paged.check_invariants()


def test_peek_with_nothing_matched_returns_the_namespace_root() -> None:
    cache = RadixCache(8)
    put(cache, [1, 2], namespace="a")

    miss = cache.peek([5], namespace="a")

    assert miss.length == 0 and miss.node.parent is None
    assert cache.peek([1, 2, 5], namespace="a").node.parent is miss.node  # the registered root


def test_peek_refuses_an_unhashable_namespace_and_names_its_type(
    paged: RadixCache, state_of: Callable[[RadixCache], dict[str, Any]]
) -> None:
    before = state_of(paged)

    with pytest.raises(RadixCacheError, match="list"):
        paged.peek(LONG, namespace=["tenant"])

    assert state_of(paged) == before


def test_peek_respects_namespaces() -> None:
    cache = RadixCache(8)
    put(cache, [1, 2], namespace="a")

    assert cache.peek([1, 2], namespace="a").length == 2
    assert cache.peek([1, 2]).length == 0
    assert cache.peek([1, 2], namespace="b").length == 0


# ------------------------------------------------------------------ lock_prefix


def test_lock_prefix_locks_exactly_the_pages_asked_for(paged: RadixCache) -> None:
    free, evictable, locked = counters(paged)

    node = paged.lock_prefix(LONG, 4)

    assert node is not None
    assert counters(paged) == (free, evictable - 1, locked + 1)  # one page, not the 16-page node holding it
    paged.check_invariants()


@pytest.mark.parametrize("n", [4, 8, 32, 60, 64])
def test_lock_prefix_locks_n_over_page_size_blocks(paged: RadixCache, n: int) -> None:
    locked = paged.locked_blocks

    node = paged.lock_prefix(LONG, n)

    assert node is not None
    assert paged.locked_blocks == locked + n // 4
    assert node.end_len == n and node.tokens() == LONG[:n]
    paged.check_invariants()


def test_lock_prefix_splits_at_exactly_n(paged: RadixCache) -> None:
    nodes = node_count(paged)
    whole = paged.peek(LONG).node

    node = paged.lock_prefix([*LONG, 0], 24)

    assert node is not None and node is not whole
    assert node_count(paged) == nodes + 1
    assert node.tokens() == LONG[:24] and len(node.blocks) == 6
    assert whole.parent is node and whole.prefix_len == 24  # the tail keeps its object, unlocked
    assert node.lock_ref == 1 and whole.lock_ref == 0
    paged.check_invariants()


def test_lock_prefix_at_a_node_boundary_does_not_split(paged: RadixCache) -> None:
    nodes = node_count(paged)
    fork = paged.peek(list(range(1, 9))).node

    node = paged.lock_prefix(list(range(1, 13)), 8)

    assert node is fork
    assert node_count(paged) == nodes
    assert paged.locked_blocks == 2
    paged.check_invariants()


@pytest.mark.parametrize(
    ("tokens", "n", "namespace"),
    [
        (LONG + [0] * 8, 68, None),  # one page past the cached tokens
        (LONG[:8] + [0] * 8, 16, None),  # diverges inside the long node, after two pages
        ([*range(1, 9), 13, 14, 0, 0], 12, None),  # diverges inside a branch
        ([7, 7, 7, 7], 4, None),  # nothing cached
        (LONG, 8, "nobody"),  # an unknown namespace
    ],
)
def test_lock_prefix_of_tokens_not_all_cached_returns_none_and_changes_nothing(
    paged: RadixCache,
    tokens: list[int],
    n: int,
    namespace: Any,
    state_of: Callable[[RadixCache], dict[str, Any]],
) -> None:
    before = state_of(paged)  # includes the node set (no split) and the namespaces (no root)
    heap = list(paged._evictable_leaves)

    assert paged.lock_prefix(tokens, n, namespace=namespace) is None

    assert state_of(paged) == before
    assert paged._evictable_leaves == heap


@pytest.mark.parametrize("bad", [0, -4, 2, 6, 68, 4.0, "4", None, True])
def test_lock_prefix_refuses_a_bad_token_count(
    paged: RadixCache, bad: Any, state_of: Callable[[RadixCache], dict[str, Any]]
) -> None:
    before = state_of(paged)

    with pytest.raises(RadixCacheError, match=repr(bad).replace(".", r"\.")):
        paged.lock_prefix(LONG, bad)  # 68 > the 64 tokens given, though a multiple of the page size

    assert state_of(paged) == before
    paged.check_invariants()


def test_lock_prefix_refuses_an_unhashable_namespace(
    paged: RadixCache, state_of: Callable[[RadixCache], dict[str, Any]]
) -> None:
    before = state_of(paged)

    with pytest.raises(RadixCacheError, match="dict"):
        paged.lock_prefix(LONG, 4, namespace={})

    assert state_of(paged) == before


def test_lock_prefix_is_not_a_query(paged: RadixCache) -> None:
    stats, meta, clock = paged.stats, page_meta(paged), paged._clock

    node = paged.lock_prefix(LONG, 12)

    assert node is not None
    assert paged.stats == stats
    assert page_meta(paged) == meta  # no access time or hit count refreshed, on the head or the tail
    assert paged._clock == clock


def test_unlocking_the_pinned_node_restores_evictability(paged: RadixCache) -> None:
    before = counters(paged)
    node = paged.lock_prefix(LONG, 20)
    assert node is not None

    paged.unlock(node)

    assert counters(paged) == before
    assert paged.evict(100) == 20
    assert counters(paged) == (32, 0, 0)
    paged.check_invariants()


def test_pinned_prefix_survives_evicting_everything_while_its_unpinned_tail_does_not(paged: RadixCache) -> None:
    node = paged.lock_prefix(LONG, 16)
    assert node is not None

    assert paged.evict(100) == 20 - 4

    assert paged.peek(LONG).length == 16
    assert paged.peek(LONG).node is node
    assert paged.peek(list(range(1, 13))).length == 0
    assert counters(paged) == (28, 0, 4)
    paged.check_invariants()


def test_a_pin_inside_a_locked_node_adds_no_locked_blocks_and_unlocks_independently(paged: RadixCache) -> None:
    whole = paged.match_prefix(LONG).node
    paged.lock(whole)
    assert paged.locked_blocks == 16

    pin = paged.lock_prefix(LONG, 8)

    assert isinstance(pin, TreeNode) and pin is not whole
    assert paged.locked_blocks == 16  # the head inherits the lock, and the pin adds one more reference
    assert pin.lock_ref == 2 and whole.lock_ref == 1
    paged.unlock(whole)
    assert paged.locked_blocks == 2  # only the pinned pages stay locked
    paged.unlock(pin)
    assert paged.locked_blocks == 0
    paged.check_invariants()


def test_two_pins_of_one_prefix_need_two_unlocks(paged: RadixCache) -> None:
    first = paged.lock_prefix(LONG, 8)
    second = paged.lock_prefix(LONG, 8)
    assert first is second is not None

    paged.unlock(first)
    assert paged.locked_blocks == 2
    paged.unlock(second)
    assert paged.locked_blocks == 0
    paged.check_invariants()


def test_lock_prefix_works_at_page_size_one() -> None:
    cache = RadixCache(8)
    put(cache, [1, 2, 3, 4, 5])

    node = cache.lock_prefix([1, 2, 3, 9], 3)

    assert node is not None and node.tokens() == [1, 2, 3]
    assert counters(cache) == (3, 2, 3)
    assert cache.evict(8) == 2
    assert cache.peek([1, 2, 3, 4, 5]).length == 3
    cache.check_invariants()


def test_lock_prefix_under_a_namespace() -> None:
    cache = RadixCache(8)
    put(cache, [1, 2, 3], namespace="a")
    put(cache, [1, 2, 3])

    node = cache.lock_prefix([1, 2, 3], 2, namespace="a")

    assert node is not None and node.namespace == "a"
    assert cache.evict(8) == 4
    assert cache.peek([1, 2, 3], namespace="a").length == 2
    assert cache.peek([1, 2, 3]).length == 0
    cache.check_invariants()
