"""Belady's policy reaches the offline optimum: checked against a brute-force search on tiny traces."""

from __future__ import annotations

import random
from functools import cache
from itertools import combinations

import pytest

from radixcache.policy.registry import POLICIES
from radixcache.sim.cache_replay import CacheReplay
from radixcache.sim.results import BELADY, BELADY_ADMISSION, DEAD_LRU
from radixcache.sim.simulation import simulate
from radixcache.sim.source import open_source
from radixcache.trace import HashRequest
from radixcache.trace.records import TokenRequest
from radixcache.trace.synthetic import multi_turn_chat, rag
from radixcache.trace.workload import hash_workload, token_workload
from tests.sim.conftest import MOONCAKE_TRACE

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


def _replay(workload: object, capacity: int, policy: str, bulk: bool, concurrency: int = 1) -> tuple:
    """A replay whose oracle policy trims leaves by its binary search (`bulk`) or one block at a time, with the
    invariants checked after every request; its figures and the tree it leaves."""
    replay = CacheReplay(workload, capacity, policy, concurrency=concurrency, check=True)
    if not bulk:
        replay.cache.policy.trims_in_bulk = False  # the one-block-at-a-time loop
    for index, request in enumerate(workload):
        replay.feed(index, request)
    replay.close()
    r = replay.result()
    tree = sorted((node.prefix_len, tuple(node.key), node.namespace) for node in replay.cache.iter_nodes())
    return r.hit_tokens, r.hit_blocks, r.evicted_blocks, replay.cache.stats.evictions, tree


WORKLOADS = {
    "chat, 4-token pages": lambda: token_workload(multi_turn_chat(conversations=15, seed=5), page_size=4),
    "rag, 8-token pages": lambda: token_workload(rag(queries=60, documents=12, seed=5), page_size=8),
    "rag, 1-token pages": lambda: token_workload(rag(queries=40, documents=10, seed=5), page_size=1),
}
CAPACITIES = {"chat, 4-token pages": 60, "rag, 8-token pages": 90, "rag, 1-token pages": 1500}


@pytest.mark.parametrize("policy", [BELADY, BELADY_ADMISSION, DEAD_LRU])
@pytest.mark.parametrize("name", list(WORKLOADS))
@pytest.mark.parametrize("concurrency", [1, 3])
def test_bulk_trimming_is_block_by_block_trimming(policy: str, name: str, concurrency: int) -> None:
    """Cutting a leaf as far as it still ranks first in one binary search gives, to the block, what cutting it one
    block at a time and re-ranking after each does: the same hits, evictions and final tree."""
    workload = WORKLOADS[name]()
    bulk = _replay(workload, CAPACITIES[name], policy, True, concurrency)
    assert bulk[2] > 0  # the capacity makes it evict
    assert bulk == _replay(workload, CAPACITIES[name], policy, False, concurrency)


@pytest.mark.slow
@pytest.mark.skipif(not MOONCAKE_TRACE.exists(), reason="needs ../shared/traces")
def test_bulk_trimming_is_block_by_block_trimming_on_the_shared_trace() -> None:
    source = open_source(str(MOONCAKE_TRACE))
    assert _replay(source, 878, BELADY, True) == _replay(source, 878, BELADY, False)


@pytest.mark.parametrize("kind", ["token", "hash"])
@pytest.mark.parametrize("policy", [BELADY, BELADY_ADMISSION, DEAD_LRU])
def test_an_oracles_memory_grows_with_the_blocks_used_not_the_capacity(kind: str, policy: str) -> None:
    """Regression: both oracles kept one entry per block id of the capacity up front, so --belady at
    --capacity-blocks 1e9 was an internal MemoryError (7.45 GiB) where LRU's replay of that cache takes 40 MB."""
    import tracemalloc

    if kind == "token":
        workload = token_workload(list(multi_turn_chat(conversations=4, vocab=50)), 4)
    else:
        workload = hash_workload([HashRequest(i, 8, 1, (i % 3, 10 + i)) for i in range(20)], block_size=4)
    roomy = workload.total_pages + 1  # nothing evicted at either capacity
    expected = simulate(workload, roomy, policy, flat=False)
    tracemalloc.start()
    try:
        huge = simulate(workload, 20_000_000, policy, flat=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    assert (huge.hit_tokens, huge.hit_blocks, huge.evicted_blocks) == (expected.hit_tokens, expected.hit_blocks, 0)
