"""The project's own `reuse` policy and the diagnostic oracle: their behaviour, pinned on small workloads."""

from __future__ import annotations

import pytest

from radixcache import RadixCache
from radixcache.errors import PolicyError
from radixcache.policy.admission import AdmissionRequest, ReuseAdmission, make_admission
from radixcache.policy.classic import CostAwarePolicy
from radixcache.policy.registry import ALL_POLICIES, POLICIES, make_policy
from radixcache.policy.reuse import ReusePolicy
from radixcache.sim.results import BELADY, DEAD_LRU
from radixcache.sim.simulation import simulate
from radixcache.trace.synthetic import multi_turn_chat, rag
from radixcache.trace.workload import token_workload


def test_reuse_is_usable_by_name_but_kept_out_of_the_core_registry() -> None:
    assert isinstance(make_policy("reuse"), ReusePolicy)
    assert "reuse" in ALL_POLICIES and "reuse" not in POLICIES
    with pytest.raises(PolicyError):
        ReusePolicy(credit=-1)
    with pytest.raises(PolicyError):
        ReusePolicy(decay=0)


def test_reuse_without_outcomes_orders_like_lru() -> None:
    cache = RadixCache(16, policy="reuse")
    for tokens in ([1, 1], [2, 2], [3, 3]):
        cache.insert(tokens, cache.allocate(2))
    cache.match_prefix([1, 1])  # one reuse, but no eviction yet: every class's rate is the mean, every credit 0
    cache.evict(2)
    assert cache.match_prefix([2, 2]).length == 0
    assert cache.match_prefix([1, 1]).length == 2 and cache.match_prefix([3, 3]).length == 2


def test_reuse_learns_that_one_kind_of_insert_returns_and_another_does_not() -> None:
    """Long inserts (8 pages) are read again soon; single pages never are. Once it has seen that, the policy keeps
    a long insert that LRU would have evicted first, and gives up a single page that LRU would have kept."""
    policy = ReusePolicy(prior=1.0, initial_horizon=4.0)
    cache = RadixCache(40, policy=policy)
    for round_ in range(60):  # each round: one long prefix, read back once, and two one-page leftovers
        long = [1000 + round_] + [7] * 7
        cache.insert(long, cache.allocate(8))
        for k in range(2):
            cache.insert([5000 + 2 * round_ + k], cache.allocate(1))
        cache.match_prefix(long)
        if cache.free_blocks < 11:
            cache.evict(11 - cache.free_blocks)
    long_class = policy.class_of(8, root=True, hits=0)
    single_class = policy.class_of(1, root=True, hits=0)
    assert policy.rate(long_class) > 2 * policy.mean_rate() > 2 * policy.rate(single_class)
    cache.evict(cache.evictable_blocks)
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], cache.allocate(8))  # a long insert, then a single page, newer
    cache.insert([9], cache.allocate(1))
    assert cache.evict(1) == 1  # LRU would take the long one's deepest page; reuse takes the single page
    assert cache.peek([9]).length == 0 and cache.peek([1, 2, 3, 4, 5, 6, 7, 8]).length == 8


def test_reuse_admission_declines_a_dead_class_and_keeps_exploring() -> None:
    policy = ReusePolicy(prior=1.0, initial_horizon=4.0)
    admission = make_admission("reuse", eviction=policy)
    assert isinstance(admission, ReuseAdmission) and admission.model is policy
    dead = policy.class_of(1, root=True, hits=0)
    live = policy.class_of(8, root=True, hits=0)
    dead_returning = policy.class_of(1, root=True, hits=0, returning=True)
    for _ in range(2000):  # one class never read in all that waiting, one read every 5 ticks
        policy._record(dead, 0.0, 50.0)
        policy._record(dead_returning, 0.0, 50.0)
        policy._record(live, 1.0, 5.0)
    assert policy.rate(dead) < admission.threshold * policy.mean_rate() < policy.rate(live)
    ask = AdmissionRequest(namespace=None, cached_pages=0, prompt_pages=1, total_pages=1, output_tokens=None)
    answers = [admission.admit(ask) for _ in range(16)]
    assert answers.count(0) == 14 and answers.count(1) == 2  # one in `explore` (8) is admitted anyway
    assert admission.admit(AdmissionRequest(None, 0, 8, 8)) == 8
    assert admission.admit(AdmissionRequest(None, 0, 1, 1, retain="conversation")) == 1


def test_reuse_admission_needs_the_reuse_policy() -> None:
    with pytest.raises(PolicyError, match=r"learns from the .reuse. eviction policy"):
        make_admission("reuse", eviction=make_policy("lru"))
    with pytest.raises(PolicyError, match="unknown admission"):
        make_admission("nope")


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


def test_the_engines_retention_wrapper_passes_hits_to_reuse() -> None:
    """The engine wraps its policy in RetentionPolicy: `reuse` must still hear of every hit through it."""
    from radixcache.runtime.kv.retention import RetentionPolicy

    wrapped = RetentionPolicy(ReusePolicy())
    assert wrapped.observes_hits and not RetentionPolicy("lru").observes_hits
    cache = RadixCache(8, policy=wrapped)
    cache.insert([1, 2, 3], cache.allocate(3))
    cache.match_prefix([1, 2, 3])
    assert wrapped.base.mean_rate() > 0  # one reuse, heard through the wrapper
    assert make_admission("reuse", eviction=wrapped).model is wrapped.base


@pytest.mark.parametrize("output_tokens", [float("nan"), -1, 2.5, True])
@pytest.mark.parametrize("admission", [None, "reuse"])
def test_reuse_refuses_an_output_length_that_is_not_a_count(output_tokens: object, admission: str | None) -> None:
    """Regression: a request built in Python with output_tokens NaN raised ValueError from int(), 2.5 under the
    reuse admission AttributeError (no bit_length), and -1 silently took the bucket of 1 output token."""
    from radixcache.trace.workload import SimRequest, Workload

    requests = tuple(SimRequest(float(i), (1, 2, i % 4), (), 3, output_tokens=output_tokens) for i in range(4))
    with pytest.raises(PolicyError, match=f"reuse: output_tokens must be an int >= 0 or None, got {output_tokens!r}"):
        simulate(Workload(requests, 1, 1, "token"), 3, "reuse", admission=admission)  # type: ignore[arg-type]
    policy = ReusePolicy()
    policy.expect(7)
    policy.expect(None)
    assert policy._expected == -1
    policy.expect(7)
    assert policy._expected == 3  # 7 tokens: bit length 3


@pytest.mark.parametrize("policy", [ReusePolicy, CostAwarePolicy])
def test_a_policy_object_serves_one_cache(policy: type) -> None:
    """Regression: a policy object replayed twice kept what it learned in the first replay (reuse's classes, keyed by
    that tree's clock, which the second tree's clock met again; cost's inflation): on the first 2,000 chat requests
    at 300 blocks, reuse hit 470,352 tokens, then 590,528 the second time, with nothing said. The second cache
    refuses it."""
    w = token_workload(list(multi_turn_chat())[:600], 16)
    given = policy()
    assert simulate(w, 100, given).hit_tokens == simulate(w, 100, policy.name).hit_tokens
    with pytest.raises(PolicyError, match=f"this {policy.__name__} object already served a cache"):
        simulate(w, 100, given)
    with pytest.raises(PolicyError, match="each cache needs its own"):
        RadixCache(8, policy=given)


def test_a_wrapped_policy_object_serves_one_cache_too() -> None:
    """Regression: only the outer policy was marked, so the policy an engine's RetentionPolicy wraps could serve two
    caches (two engines, or an engine and a simulation), sharing what it learned."""
    from radixcache.policy import make_policy
    from radixcache.runtime.kv.retention import RetentionPolicy

    given = make_policy("reuse")
    RadixCache(8, 1, RetentionPolicy(given))
    with pytest.raises(PolicyError, match="ReusePolicy object already served a cache"):
        RadixCache(8, 1, RetentionPolicy(given))
    with pytest.raises(PolicyError, match="ReusePolicy object already served a cache"):
        RadixCache(8, 1, given)


def test_compare_runs_a_policy_object_with_an_admission() -> None:
    """Regression: compare gave one policy object to its plain replay and to its admission's, and the second cache
    refused it (a PolicyError from compare's own rows); the admission's replay gets a copy, with the name's
    figures."""
    from radixcache.policy import make_policy
    from radixcache.sim.compare import compare

    w = token_workload(list(multi_turn_chat(seed=0))[:50], 4)
    by_object = compare(w, 64, [make_policy("lru")], admission="all", bounds=(), infinite=False)  # type: ignore[list-item]
    by_name = compare(w, 64, ["lru"], admission="all", bounds=(), infinite=False)
    assert [r.result.hit_tokens for r in by_object] == [r.result.hit_tokens for r in by_name]
    assert len(by_object) == 2


def test_reuse_hears_a_requests_output_length_for_its_own_insert_only() -> None:
    """Regression: a recorded request whose prompt went into the tree at its start and whose output filled no page
    inserted nothing new at its finish, so the output length it told reuse stayed unread, and the next request's
    leaf (inserted at its start, before its own length is known: -1) took it: 4,000 tokens' bucket for a request
    of 3. Each leaf's group has its own request's bucket, or -1."""
    from radixcache.sim.cache_replay import CacheReplay
    from radixcache.trace import HashRequest
    from radixcache.trace.workload import hash_workload

    requests = [
        HashRequest(0.0, 8, 4000, (1, 2), output_hash_ids=(), finish_timestamp_ms=1.0),
        HashRequest(2.0, 8, 3, (7, 8), output_hash_ids=(), finish_timestamp_ms=3.0),
        HashRequest(4.0, 12, 5, (1, 2, 3), output_hash_ids=(9,)),  # no finish time: its leaf (3, 9) comes at its end
    ]
    workload = hash_workload(requests, 4)
    replay = CacheReplay(workload, 10, "reuse")
    for index, request in enumerate(workload):
        replay.feed(index, request)
    replay.close()
    buckets = [group[0][0][2] for group in replay.cache.policy._groups.values()]  # each leaf's output bucket
    assert buckets == [-1, -1, (5).bit_length()]
