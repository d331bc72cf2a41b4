"""Each eviction policy's order, shown on hand-built scenarios whose expected order is worked out by hand."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from radixcache import POLICIES, PolicyError, RadixCache
from radixcache.policy.admission import ReuseAdmission
from radixcache.policy.classic import CostAwarePolicy, SLRUPolicy
from radixcache.policy.reuse import ReusePolicy


def put(cache: RadixCache, tokens: Sequence[int]) -> list[int]:
    blocks = cache.allocate(-(-len(tokens) // cache.page_size))
    cache.insert(tokens, blocks)
    return blocks


def branch_sizes(cache: RadixCache) -> Counter[int]:
    """Cached blocks per branch, a branch being named by its first token."""
    sizes: Counter[int] = Counter()
    for node in cache.iter_nodes():
        top = node
        while top.parent is not None and top.parent.parent is not None:
            top = top.parent
        sizes[top.key[0]] += len(node.blocks)
    return sizes


def eviction_order(cache: RadixCache) -> list[int]:
    """Evict one block at a time until nothing is evictable; return the branches in the order they were first hit."""
    order: list[int] = []
    before = branch_sizes(cache)
    while cache.evictable_blocks:
        assert cache.evict(1) == 1
        after = branch_sizes(cache)
        (shrunk,) = [b for b in before if after[b] != before[b]]
        if shrunk not in order:
            order.append(shrunk)
        before = after
    return order


def four_branches(policy: str) -> RadixCache:
    """One scenario for every policy. Clock ticks are noted as tN; each branch is one leaf under the root.

    branch   tokens        inserted  hits  last access
    1        [1, 1]        t1        3     t7
    2        [2] * 8192    t2        1     t9     (deep: mean depth 4096, so twice the recompute cost)
    3        [3, 3]        t3        1     t8
    4        [4, 4]        t4        2     t11
    """
    cache = RadixCache(9000, policy=policy)
    for tokens in ([1, 1], [2] * 8192, [3, 3], [4, 4]):
        put(cache, tokens)
    for tokens in ([1, 1], [1, 1], [1, 1], [3, 3], [2] * 8192, [4, 4], [4, 4]):
        cache.match_prefix(tokens)
    return cache


# Worked out from the table above:
# lru  by last access:                    1 (t7), 3 (t8), 2 (t9), 4 (t11)
# lfu  by (hits, last access):            3 (1, t8), 2 (1, t9), 4 (2, t11), 1 (3, t7)
# fifo by insertion:                      1, 2, 3, 4
# slru probation (hits < 2) first, LRU inside each segment: 3, 2 | 1, 4
# cost (hits + 1) * (1 + mean depth / 4096): 3 = 2.0005, 4 = 3.0007, 2 = 2 * 2 = 4.0, 1 = 4.001; a trimmed leaf
#      keeps its value (a trim is not an access), so each branch goes completely before the next.
EXPECTED_ORDERS = {
    "lru": [1, 3, 2, 4],
    "lfu": [3, 2, 4, 1],
    "fifo": [1, 2, 3, 4],
    "slru": [3, 2, 1, 4],
    "cost": [3, 4, 2, 1],
}


@pytest.mark.parametrize("policy", sorted(EXPECTED_ORDERS))
def test_each_policy_evicts_the_shared_scenario_in_its_own_order(policy: str) -> None:
    assert eviction_order(four_branches(policy)) == EXPECTED_ORDERS[policy]


def test_policies_produce_different_orders_on_the_same_scenario() -> None:
    orders = {policy: tuple(eviction_order(four_branches(policy))) for policy in POLICIES}
    assert len(set(orders.values())) == len(POLICIES), orders


def test_every_named_policy_is_covered() -> None:
    assert set(POLICIES) == set(EXPECTED_ORDERS)


def test_lru_evicts_the_least_recently_matched_leaf_first() -> None:
    cache = RadixCache(16, policy="lru")
    put(cache, [1, 1])
    put(cache, [2, 2])
    cache.match_prefix([1, 1])  # 1 is now more recent than 2

    assert eviction_order(cache) == [2, 1]


def test_lru_counts_a_match_of_a_prefix_as_an_access_of_the_path_only() -> None:
    cache = RadixCache(16, policy="lru")
    put(cache, [1, 1, 1])
    put(cache, [1, 1, 2])  # branch point at [1, 1]
    put(cache, [2, 2])
    cache.match_prefix([1, 1])  # refreshes [1, 1], not the leaves below it

    order: list[tuple[int, ...]] = []
    paths = {tuple(node.tokens()) for node in cache.iter_nodes()}
    while cache.evictable_blocks:
        cache.evict(1)
        now = {tuple(node.tokens()) for node in cache.iter_nodes()}
        order.extend(sorted(paths - now))
        paths = now
    assert order[:2] == [(1, 1, 1), (1, 1, 2)]  # inserted before [2, 2], not refreshed since
    assert order[2] == (2, 2)  # [1, 1] was matched last


def test_reinserting_a_cached_sequence_refreshes_it_for_lru_but_not_for_fifo() -> None:
    orders = {}
    for policy in ("lru", "fifo"):
        cache = RadixCache(16, policy=policy)
        put(cache, [1, 1])
        put(cache, [2, 2])
        cache.insert([1, 1], cache.allocate(2))  # all cached: the duplicates go back, [1, 1] counts as accessed
        orders[policy] = eviction_order(cache)
    assert orders == {"lru": [2, 1], "fifo": [1, 2]}


def test_lfu_hit_count_increments_on_every_match() -> None:
    cache = RadixCache(16, policy="lfu")
    put(cache, [1, 1])
    node = cache.match_prefix([1, 1]).node
    for _ in range(4):
        cache.match_prefix([1, 1, 5])

    assert node.hit_count == 5


def test_lfu_keeps_the_often_matched_leaf_over_a_more_recent_one() -> None:
    cache = RadixCache(16, policy="lfu")
    put(cache, [1, 1])
    put(cache, [2, 2])
    for _ in range(3):
        cache.match_prefix([1, 1])
    cache.match_prefix([2, 2])  # most recent, but one hit against three

    assert eviction_order(cache) == [2, 1]


def test_lfu_breaks_hit_ties_by_recency() -> None:
    cache = RadixCache(16, policy="lfu")
    put(cache, [1, 1])
    put(cache, [2, 2])
    cache.match_prefix([2, 2])
    cache.match_prefix([1, 1])

    assert eviction_order(cache) == [2, 1]


def test_fifo_ignores_hits_and_recency() -> None:
    cache = RadixCache(16, policy="fifo")
    put(cache, [1, 1])
    put(cache, [2, 2])
    for _ in range(5):
        cache.match_prefix([1, 1])

    assert eviction_order(cache) == [1, 2]


def test_slru_evicts_probation_leaves_before_protected_ones() -> None:
    cache = RadixCache(16, policy="slru")
    put(cache, [1, 1])
    cache.match_prefix([1, 1])
    cache.match_prefix([1, 1])  # two hits: protected, and the least recent of all
    put(cache, [2, 2])
    put(cache, [3, 3])
    cache.match_prefix([3, 3])  # one hit: still on probation

    assert eviction_order(cache) == [2, 3, 1]


def test_slru_is_lru_inside_the_protected_segment() -> None:
    cache = RadixCache(16, policy="slru")
    put(cache, [1, 1])
    put(cache, [2, 2])
    for tokens in ([2, 2], [2, 2], [1, 1], [1, 1], [2, 2]):
        cache.match_prefix(tokens)

    assert eviction_order(cache) == [1, 2]


def test_cost_keeps_a_deep_leaf_over_a_more_recent_shallow_one() -> None:
    cache = RadixCache(9000, policy="cost")
    put(cache, [2] * 8000 + [5, 5])  # one long prefix...
    cache.match_prefix([2] * 8000)  # ...split so that [5, 5] is a leaf at depth 8000
    put(cache, [1, 1])  # shallow, and the most recent

    first = cache.evict(1)

    assert first == 1
    assert cache.match_prefix([1, 1]).length == 1
    assert cache.match_prefix([2] * 8000 + [5, 5]).length == 8002


def test_lru_on_the_same_deep_and_shallow_leaves_evicts_the_deep_one() -> None:
    cache = RadixCache(9000, policy="lru")
    put(cache, [2] * 8000 + [5, 5])
    cache.match_prefix([2] * 8000)
    put(cache, [1, 1])

    cache.evict(1)

    assert cache.match_prefix([2] * 8000 + [5, 5]).length == 8001


def test_cost_keeps_a_more_hit_leaf_at_the_same_depth() -> None:
    cache = RadixCache(16, policy="cost")
    put(cache, [1, 1])
    put(cache, [2, 2])
    cache.match_prefix([1, 1])
    cache.match_prefix([1, 1])
    cache.match_prefix([2, 2])  # more recent, fewer hits

    assert eviction_order(cache) == [2, 1]


def test_cost_inflation_ages_a_once_popular_leaf() -> None:
    """Old hits stop protecting a leaf once evictions have raised the inflation past its value.

    [1, 1] gets 9 hits (value 10). [2, 2] gets 8 hits (value 9) and is evicted first, raising inflation to 9.
    [3, 3] is then inserted and hit once: value 9 + 2 = 11 > 10, so the stale [1, 1] goes before it.
    LFU, with no aging, evicts [3, 3] (1 hit) first on the same history.
    """

    def history(policy: str) -> RadixCache:
        cache = RadixCache(16, policy=policy)
        put(cache, [1, 1])
        put(cache, [2, 2])
        for _ in range(9):
            cache.match_prefix([1, 1])
        for _ in range(8):
            cache.match_prefix([2, 2])
        cache.evict(2)
        assert cache.match_prefix([2, 2]).length == 0
        put(cache, [3, 3])
        cache.match_prefix([3, 3])
        return cache

    assert eviction_order(history("cost")) == [1, 3]
    assert eviction_order(history("lfu")) == [3, 1]


def test_policy_names_are_case_insensitive_and_unknown_names_raise() -> None:
    assert RadixCache(4, policy="LRU").policy.name == "lru"
    with pytest.raises(PolicyError):
        RadixCache(4, policy="mru")


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_partial_eviction_is_not_an_access_so_the_same_leaf_stays_first(policy: str) -> None:
    # Under cost, re-ranking a trimmed leaf with the raised inflation would send it to the back of the line
    # and rotate evict(1) calls across leaves; every policy must instead keep taking from the same leaf.
    cache = four_branches(policy)
    first = EXPECTED_ORDERS[policy][0]
    start = branch_sizes(cache)
    assert start[first] >= 2
    for taken in range(1, start[first]):
        assert cache.evict(1) == 1
        assert branch_sizes(cache) == start - Counter({first: taken})
    cache.check_invariants()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda v: SLRUPolicy(v), "slru: protect_after"),
        (lambda v: CostAwarePolicy(v), "cost: attention_scale"),
        (lambda v: ReusePolicy(credit=v), "reuse: credit"),
        (lambda v: ReusePolicy(penalty=v), "reuse: penalty"),
        (lambda v: ReusePolicy(clip=v), "reuse: clip"),
        (lambda v: ReusePolicy(prior=v), "reuse: prior"),
        (lambda v: ReusePolicy(decay=v), "reuse: decay"),
        (lambda v: ReusePolicy(initial_horizon=v), "reuse: initial_horizon"),
        (lambda v: ReusePolicy(ghosts=v), "reuse: ghosts"),  # -1 turned ghosts off silently, "1" a TypeError later
        (lambda v: ReuseAdmission(ReusePolicy(), threshold=v), "reuse admission: threshold"),
    ],
)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, "1", True])
def test_a_policy_parameter_that_is_nan_infinite_or_not_a_number_is_refused(make, message: str, value: object) -> None:
    """Regression: each check was `value < low`, which NaN passes: cost and reuse then keyed every leaf NaN (an
    arbitrary eviction order), slru protected nothing and the reuse admission declined every class, all silently.
    Infinities and strings got through or raised TypeError; each is now a PolicyError naming the parameter."""
    with pytest.raises(PolicyError, match=message):
        make(value)
    make(1)  # the parameter's own sane value is taken
