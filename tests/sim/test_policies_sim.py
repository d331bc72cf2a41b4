"""The project's own `reuse` policy and the diagnostic oracle: their behaviour, pinned on small workloads."""

from __future__ import annotations

import pytest

from radixcache import RadixCache
from radixcache.errors import PolicyError
from radixcache.policies import ALL_POLICIES, POLICIES, ReuseAwarePolicy, make_policy
from radixcache.simulate import BELADY, DEAD_LRU, simulate
from radixcache.simulate_workload import token_workload
from radixcache.synthetic import multi_turn_chat, rag


def test_reuse_is_usable_by_name_but_kept_out_of_the_core_registry() -> None:
    assert isinstance(make_policy("reuse"), ReuseAwarePolicy)
    assert "reuse" in ALL_POLICIES and "reuse" not in POLICIES
    with pytest.raises(PolicyError):
        ReuseAwarePolicy(k=-1)


def test_reuse_without_outcomes_orders_like_lru() -> None:
    cache = RadixCache(16, policy="reuse")
    for tokens in ([1, 1], [2, 2], [3, 3]):
        cache.insert(tokens, cache.allocate(2))
    cache.match_prefix([1, 1])  # one hit, but no outcome has been scored yet: every credit is zero
    cache.evict(2)
    assert cache.match_prefix([2, 2]).length == 0
    assert cache.match_prefix([1, 1]).length == 2 and cache.match_prefix([3, 3]).length == 2


def test_reuse_credits_a_class_that_is_hit_again_and_penalises_one_that_is_not() -> None:
    policy = ReuseAwarePolicy(prior=1.0)
    for _ in range(50):
        policy._record(1, True)
        policy._record(0, False)
    assert policy._relative_rate(1) == policy.max_credit
    assert policy._relative_rate(0) == -policy.max_penalty


@pytest.mark.parametrize("policy", ["reuse", DEAD_LRU])
def test_policies_keep_every_cache_invariant_through_a_replay(policy: str) -> None:
    w = token_workload(multi_turn_chat(conversations=12, seed=3), page_size=4)
    result = simulate(w, 300, policy, concurrency=2, check=True)
    assert 0 < result.hit_rate <= simulate(w, 300, BELADY, concurrency=2).hit_rate + 1e-9


def test_reuse_beats_lru_where_reused_documents_meet_one_off_suffixes() -> None:
    w = token_workload(rag(queries=300, documents=100, seed=1), page_size=16)
    assert simulate(w, 400, "reuse").hit_rate > simulate(w, 400, "lru").hit_rate


def test_dead_block_oracle_lies_between_lru_and_belady_on_chat() -> None:
    w = token_workload(multi_turn_chat(conversations=60, seed=2), page_size=16)
    lru, dead, best = (simulate(w, 600, p).hit_rate for p in ("lru", DEAD_LRU, BELADY))
    assert lru <= dead <= best
