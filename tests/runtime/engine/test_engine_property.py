"""Property: for any sequence of requests built from shared pieces, at any page size and any capacity that fits
one request, the cache-on engine gives the cache-off engine's greedy tokens, and the cache stays consistent."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache import CacheFullError
from radixcache.runtime import Engine
from radixcache.runtime.testing import tiny_model

MODEL = tiny_model(seed=21)
PIECES = [torch.randint(1, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (3, 7, 12, 20)]

requests = st.lists(
    st.tuples(st.lists(st.integers(0, len(PIECES) - 1), min_size=1, max_size=4), st.integers(1, 6)),
    min_size=1,
    max_size=6,
)


@settings(max_examples=25)
@given(page=st.sampled_from([1, 2, 4, 16]), spare=st.integers(0, 6), reqs=requests)
def test_cache_on_equals_cache_off_for_any_request_sequence(page: int, spare: int, reqs: list) -> None:
    longest = max(sum(len(PIECES[i]) for i in pieces) + n for pieces, n in reqs)
    capacity = -(-longest // page) + spare  # from "one request just fits" to some room for reuse
    on = Engine(MODEL, capacity_blocks=capacity, page_size=page)
    off = Engine(MODEL, capacity_blocks=capacity, page_size=page, enable_cache=False)
    for pieces, n in reqs:
        prompt = [t for i in pieces for t in PIECES[i]]
        try:
            a = on.generate(prompt, n, ignore_eos=True, return_logits=True)
        except CacheFullError:  # pragma: no cover - capacity is sized to fit every request
            raise AssertionError("a request that fits alone was refused") from None
        b = off.generate(prompt, n, ignore_eos=True, return_logits=True)
        assert a.token_ids == b.token_ids
        assert (a.logits - b.logits).abs().max().item() < 1e-4
        assert a.cached_tokens % page == 0 and a.cached_tokens < len(prompt)
        on.cache.check_invariants()
        assert on.cache.locked_blocks == 0 and on.cache.held_blocks == 0
    assert off.cache.free_blocks == capacity
