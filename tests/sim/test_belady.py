"""Belady's policy reaches the offline optimum: checked against a brute-force search on tiny traces."""

from __future__ import annotations

import random
from functools import cache
from itertools import combinations

import pytest

from radixcache.policies import POLICIES
from radixcache.records import TokenRequest
from radixcache.simulate import simulate
from radixcache.simulate_workload import hash_workload, token_workload
from radixcache.trace import HashRequest

# A binary tree of blocks: block b's children are 2b and 2b+1. A request reads a root-to-node path.
PARENT = {b: b // 2 for b in range(2, 16)}


def path_to(block: int) -> tuple[int, ...]:
    out = [block]
    while out[-1] in PARENT:
        out.append(PARENT[out[-1]])
    return tuple(reversed(out))


def brute_force_hits(paths: list[tuple[int, ...]], capacity: int) -> int:
    """Most block hits any eviction schedule reaches: demand insertion, prefix-closed cache, exhaustive search."""

    @cache
    def best(i: int, cached: frozenset[int]) -> int:
        if i == len(paths):
            return 0
        path = paths[i]
        k = 0
        while k < len(path) and path[k] in cached:
            k += 1
        need = len(cached) + len(path) - k - capacity
        candidates = sorted(cached - set(path[:k]))
        options = []
        for gone in combinations(candidates, max(0, need)):
            kept = cached - set(gone)
            if all(PARENT.get(b) is None or PARENT[b] in kept for b in kept):  # still prefix-closed
                options.append(kept | set(path))
        return k + max(best(i + 1, frozenset(kept)) for kept in options)

    return best(0, frozenset())


def random_paths(rng: random.Random, n: int) -> list[tuple[int, ...]]:
    return [path_to(rng.randrange(1, 16)) for _ in range(n)]


@pytest.mark.parametrize("seed", range(60))
def test_belady_equals_the_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    paths = random_paths(rng, rng.randint(4, 9))
    capacity = rng.randint(4, 6)  # at least the longest path (4 blocks)
    trace = [HashRequest(i, 4 * len(p), 1, p) for i, p in enumerate(paths)]
    result = simulate(hash_workload(trace, block_size=4), capacity, "belady", check=True)
    assert result.hit_blocks == brute_force_hits(paths, capacity)


@pytest.mark.parametrize("seed", range(20))
def test_belady_on_paged_token_traces_equals_the_brute_force_optimum(seed: int) -> None:
    # The same tree, spelt as tokens: block b is the page (2b, 2b+1) at page size 2.
    rng = random.Random(1000 + seed)
    paths = random_paths(rng, rng.randint(4, 9))
    capacity = rng.randint(4, 6)
    trace = [TokenRequest(i, tuple(t for b in p for t in (2 * b, 2 * b + 1)), 0) for i, p in enumerate(paths)]
    result = simulate(token_workload(trace, page_size=2), capacity, "belady", check=True)
    assert result.hit_blocks == brute_force_hits(paths, capacity)


@pytest.mark.parametrize("seed", range(10))
def test_no_policy_beats_belady(seed: int) -> None:
    rng = random.Random(seed)
    paths = random_paths(rng, 200)
    w = hash_workload([HashRequest(i, 4 * len(p), 1, p) for i, p in enumerate(paths)], block_size=4)
    optimum = simulate(w, 6, "belady").hit_blocks
    for name in POLICIES:
        assert simulate(w, 6, name).hit_blocks <= optimum, name
