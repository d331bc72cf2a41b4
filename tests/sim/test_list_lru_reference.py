"""`simulate`'s LRU figures against a plain list-based LRU over blocks, on random traces, one request at a time.

The reference knows no tree, no clock and no policy object: the cache is a Python list of blocks (each a page-aligned
prefix, its namespace included), oldest first. A prompt's cached pages, and on insert every page of the path, move to
the young end, deepest first, so that a prefix is always younger than what extends it and the oldest unlocked block
is never one that a cached block extends. Eviction pops the oldest block the running request has not matched.
Capacity edges are checked the same way: one block, and more blocks than the trace ever holds (then nothing is
evicted and the hit rate is the infinite cache's).
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from radixcache.errors import RadixCacheError
from radixcache.sim.simulation import simulate, simulate_infinite
from radixcache.trace import HashRequest
from radixcache.trace.records import TokenRequest
from radixcache.trace.workload import Workload, hash_workload, token_workload


def list_lru(workload: Workload, capacity: int) -> dict[str, int]:
    """hit tokens, hit blocks, evicted blocks and oversized requests of an LRU list of blocks."""
    p = workload.page_size
    order: list[tuple] = []  # cached blocks, least recently used first
    out = dict.fromkeys(("hit_tokens", "hit_blocks", "evicted", "oversized"), 0)

    def block(request, tokens: tuple, i: int) -> tuple:
        return (request.namespace, tokens[: (i + 1) * p])

    def touch(blocks: list[tuple]) -> None:
        for b in reversed(blocks):  # deepest first: the shortest prefix ends youngest
            if b in order:
                order.remove(b)
            order.append(b)

    for r in workload:
        prompt, full = tuple(r.prompt), tuple(r.prompt) + tuple(r.output)
        matched = 0
        while matched < len(prompt) // p and block(r, prompt, matched) in order:
            matched += 1
        locked = [block(r, prompt, i) for i in range(matched)]
        touch(locked)
        out["hit_blocks"] += matched
        out["hit_tokens"] += min(matched * p * r.unit, r.prompt_tokens)
        need = -(-len(full) // p) - matched
        room = capacity - matched  # free blocks and unlocked cached ones
        if need > room:
            need, full = room, full[: (matched + room) * p]
            out["oversized"] += 1
        while capacity - len(order) < need:
            victim = next(b for b in order if b not in locked)
            order.remove(victim)
            out["evicted"] += 1
        path = [block(r, full, i) for i in range(len(full) // p)]
        if any(b not in order for b in path):  # an insert that adds a page refreshes the whole path
            touch(path)
    return out


@st.composite
def token_traces(draw: st.DrawFn) -> list[TokenRequest]:
    requests: list[TokenRequest] = []
    seen: list[tuple[int, ...]] = [()]
    for i in range(draw(st.integers(1, 30))):
        base = draw(st.sampled_from(seen))
        tokens = base[: draw(st.integers(0, len(base)))] + tuple(draw(st.lists(st.integers(0, 3), max_size=7)))
        output = tuple(draw(st.lists(st.integers(0, 3), max_size=4))) or None
        namespace = draw(st.sampled_from([None, None, "b"]))
        requests.append(
            TokenRequest(float(i), tokens or (1,), len(output or ()), namespace=namespace, output_tokens=output)
        )
        seen.append((tokens or (1,)) + (output or ()))
    return requests


@st.composite
def hash_traces(draw: st.DrawFn) -> list[HashRequest]:
    requests: list[HashRequest] = []
    seen: list[tuple[int, ...]] = [()]
    chained = draw(st.booleans())
    fresh = iter(range(100, 10**6))
    for i in range(draw(st.integers(1, 25))):
        base = draw(st.sampled_from(seen))
        ids = base[: draw(st.integers(0, len(base)))]
        extra = draw(st.integers(0 if ids else 1, 6))
        ids += tuple(next(fresh) if chained else draw(st.integers(0, 6)) for _ in range(extra))
        requests.append(HashRequest(float(i), 8 * (len(ids) - 1) + draw(st.integers(1, 8)), 2, ids))
        seen.append(ids)
    return requests


def workloads() -> st.SearchStrategy[Workload]:
    tokens = st.builds(token_workload, token_traces(), st.integers(1, 3))
    hashes = st.builds(hash_workload, hash_traces(), st.just(8))
    return st.one_of(tokens, hashes)


def figures(workload: Workload, capacity: int, flat: bool) -> dict[str, int]:
    r = simulate(workload, capacity, "lru", flat=flat)
    return {"hit_tokens": r.hit_tokens, "hit_blocks": r.hit_blocks, "evicted": r.evicted_blocks,
            "oversized": r.oversized_requests}  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(workload=workloads(), capacity=st.integers(1, 16))
def test_lru_gives_a_list_of_blocks_figures(workload: Workload, capacity: int) -> None:
    expected = list_lru(workload, capacity)
    assert figures(workload, capacity, flat=False) == expected
    assert figures(workload, capacity, flat=True) == expected


@settings(max_examples=40, deadline=None)
@given(workload=workloads())
def test_one_block_and_more_blocks_than_the_trace_holds(workload: Workload) -> None:
    assert figures(workload, 1, flat=False) == list_lru(workload, 1)
    roomy = workload.total_pages + 1  # every page of every request fits: nothing is ever evicted
    result = simulate(workload, roomy, "lru")
    assert result.evicted_blocks == result.oversized_requests == 0
    assert result.hit_tokens == simulate_infinite(workload).hit_tokens == list_lru(workload, roomy)["hit_tokens"]


@pytest.mark.parametrize("capacity", [0, -1, 1.0, True])
def test_a_capacity_under_one_block_is_refused(capacity: object) -> None:
    workload = token_workload([TokenRequest(0.0, (1, 2, 3), 0)], 1)
    with pytest.raises(RadixCacheError, match="capacity"):
        simulate(workload, capacity, "lru")  # type: ignore[arg-type]
