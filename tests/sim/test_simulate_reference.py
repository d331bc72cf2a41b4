"""`simulate`'s figures against a recompute from the trace: each request replayed over the brute-force page
reference of tests/cache/test_policy_reference.py (no tree), with requests in flight, recorded outputs, partial last
pages, requests larger than the cache and hash traces whose ids are not chained; the flat LRU replay and the
tree's must both give the recompute's hit tokens, hit blocks, evictions and oversized requests."""

from __future__ import annotations

from collections import deque

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from radixcache.policy.registry import ALL_POLICIES
from radixcache.sim.results import BELADY, ORACLE_POLICIES
from radixcache.sim.simulation import simulate
from radixcache.trace import HashRequest
from radixcache.trace.records import TokenRequest
from radixcache.trace.workload import Workload, hash_workload, token_workload
from tests.cache.test_policy_reference import KEYS, PageReference


def recompute(workload: Workload, capacity: int, policy: str, concurrency: int) -> dict[str, int]:
    """The replay's figures, counted from the requests and the page reference alone."""
    p = workload.page_size
    ref = PageReference(p, KEYS[policy])
    held = 0  # blocks requests in flight hold
    running: deque = deque()
    figures = dict.fromkeys(("hit_tokens", "prompt_tokens", "hit_blocks", "prompt_blocks", "evicted", "oversized"), 0)

    def finish() -> None:
        nonlocal held
        tokens, matched, need = running.popleft()
        ref.insert(list(tokens))
        ref.lock(list(tokens), matched, -1)
        held -= need

    for request in workload:
        while len(running) >= concurrency:
            finish()
        prompt = list(request.prompt)
        full = prompt + list(request.output)
        matched = ref.match(prompt)
        ref.lock(full, matched, 1)
        figures["hit_tokens"] += min(matched * p * request.unit, request.prompt_tokens)
        figures["prompt_tokens"] += request.prompt_tokens
        figures["hit_blocks"] += matched
        figures["prompt_blocks"] += -(-len(prompt) // p)
        need = -(-len(full) // p) - matched
        free = capacity - len(ref.pages) - held
        room = free + sum(1 for page in ref.pages.values() if not page["locks"])
        if need > room:  # it caches the whole pages that fit
            need, full = room, full[: (matched + room) * p]
            figures["oversized"] += 1
        before = len(ref.pages)
        ref.evict(max(0, need - free))
        figures["evicted"] += before - len(ref.pages)
        held += need
        running.append((full, matched, need))
    while running:
        finish()
    return figures


def replayed(workload: Workload, capacity: int, policy: str, concurrency: int, flat: bool) -> dict[str, int]:
    r = simulate(workload, capacity, policy, concurrency=concurrency, flat=flat)
    return {
        "hit_tokens": r.hit_tokens,
        "prompt_tokens": r.prompt_tokens,
        "hit_blocks": r.hit_blocks,
        "prompt_blocks": r.prompt_blocks,
        "evicted": r.evicted_blocks,
        "oversized": r.oversized_requests,
    }


@st.composite
def token_traces(draw: st.DrawFn) -> list[TokenRequest]:
    requests: list[TokenRequest] = []
    seen: list[tuple[int, ...]] = [()]
    for i in range(draw(st.integers(1, 24))):
        base = draw(st.sampled_from(seen))
        # often a cut of an earlier sequence and nothing more: a request that another, longer one in flight extends
        extra = draw(st.one_of(st.just([]), st.lists(st.integers(0, 2), max_size=6)))
        tokens = base[: draw(st.integers(0, len(base)))] + tuple(extra)
        output = tuple(draw(st.lists(st.integers(0, 2), max_size=3))) or None
        requests.append(TokenRequest(float(i), tokens or (0,), len(output or ()), output_tokens=output))
        seen.append((tokens or (0,)) + (output or ()))
    return requests


@st.composite
def hash_traces(draw: st.DrawFn) -> list[HashRequest]:
    """Chained ids (each new id fresh), or ids drawn from a few (an id after several parents, or twice in a path)."""
    chained = draw(st.booleans())
    requests: list[HashRequest] = []
    seen: list[tuple[int, ...]] = [()]
    fresh = iter(range(100, 10**6))
    for i in range(draw(st.integers(1, 20))):
        base = draw(st.sampled_from(seen))
        ids = base[: draw(st.integers(0, len(base)))]
        extra = draw(st.integers(0 if ids else 1, 5))
        ids += tuple(next(fresh) if chained else draw(st.integers(0, 5)) for _ in range(extra))
        requests.append(HashRequest(float(i), 4 * (len(ids) - 1) + draw(st.integers(1, 4)), 1, ids))
        seen.append(ids)
    return requests


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "slru"])
@settings(max_examples=30)
@given(data=st.data())
def test_simulate_gives_the_recomputed_figures(policy: str, data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        workload = token_workload(data.draw(token_traces()), data.draw(st.integers(1, 3)))
    else:
        workload = hash_workload(data.draw(hash_traces()), block_size=4)
    capacity, concurrency = data.draw(st.integers(1, 14)), data.draw(st.integers(1, 4))
    expected = recompute(workload, capacity, policy, concurrency)
    for flat in (True, False):
        assert replayed(workload, capacity, policy, concurrency, flat) == expected


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_no_online_policy_beats_belady_at_concurrency_one(data: st.DataObject) -> None:
    """Every registered online policy (the experimental ones too), on token traces with recorded outputs and partial
    pages and on hash traces chained or not: Belady's resident bound hits at least as many blocks (the optimum is
    in blocks; a partial last block makes tokens a different count)."""
    if data.draw(st.booleans()):
        workload = token_workload(data.draw(token_traces()), data.draw(st.integers(1, 3)))
    else:
        workload = hash_workload(data.draw(hash_traces()), block_size=4)
    capacity = data.draw(st.integers(1, 14))
    optimum = simulate(workload, capacity, BELADY)
    for name in sorted(set(ALL_POLICIES) - set(ORACLE_POLICIES)):
        r = simulate(workload, capacity, name)
        assert r.hit_blocks <= optimum.hit_blocks, name
