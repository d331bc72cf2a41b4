"""A lease's life in the engine, on a clock the test advances: granted at the end of a request, holding exactly
its pages; evictable at the first eviction after its deadline; renewed by a hit; bounded by the budget with the
oldest giving way; never taken by a cancelled or failed request; beside pins, which keep their meaning. The tree's
invariants are checked after every scheduler step (conftest.make_engine)."""

from __future__ import annotations

import pytest

from radixcache.runtime.kv.leases import NO_LEASE, LeaseGrant
from tests.runtime.leases.conftest import PAGE, check_leases, prompt


def test_a_lease_holds_prompt_and_reply_until_its_deadline_then_the_first_eviction_takes_them(make_engine, clock):
    engine = make_engine(capacity_blocks=24)
    ids = prompt(0, 30)
    r = engine.generate(ids, 7, retain_for=10, ignore_eos=True)
    # 30 prompt + 7 output tokens; the last token's KV never exists: 36 positions = 9 whole pages
    assert r.lease == LeaseGrant(10.0, 36)
    g = engine.check()
    assert (g["leases"], g["leased_blocks"], g["locked_blocks"], g["evictable_blocks"]) == (1, 9, 9, 0)
    clock.advance(9.99)
    engine.generate(prompt(1, 24), 1)  # 6 pages, evictable once it ends
    other = engine.generate(prompt(2, 40), 4, ignore_eos=True)  # 11 pages of the 9 free: evicts
    assert other.cached_tokens == 0
    assert engine.check()["leased_blocks"] == 9  # still held: LRU took the other request's pages instead
    assert engine.generate(ids + list(r.token_ids), 1).cached_tokens == 36
    assert engine.kv.leases.deadlines() == [pytest.approx(19.99)]  # that hit renewed it
    clock.advance(10)  # the deadline: the next eviction may take them
    engine.generate(prompt(3, 80), 4, ignore_eos=True)  # 21 of 24 pages: evicts nearly everything
    leases = engine.kv.leases
    assert (leases.expired, leases.given_way, len(leases)) == (1, 0, 0)  # it expired; it did not give way
    assert engine.generate(ids, 1).cached_tokens < 36
    assert engine.check()["locked_blocks"] == 0


def test_an_idle_engine_releases_an_expired_lease_when_its_gauges_are_read(make_engine, clock):
    engine = make_engine()
    engine.generate(prompt(0, 20), 3, retain_for=5)
    assert engine.check()["leased_blocks"] > 0
    clock.advance(5)
    g = engine.check()
    assert (g["leases"], g["leased_blocks"], g["locked_blocks"]) == (0, 0, 0)


def test_a_hit_renews_the_lease_and_an_unrenewed_one_expires(make_engine, clock):
    engine = make_engine()
    ids = prompt(0, 24)
    r = engine.generate(ids, 8, retain_for=10, ignore_eos=True)
    assert r.lease.tokens == 28  # 24 + 8 tokens, the last one's KV never exists: 7 whole pages
    clock.advance(8)
    hit = engine.generate(ids + list(r.token_ids) + prompt(3, 6), 2)  # the next turn: no lease of its own
    assert hit.cached_tokens == 28 and hit.lease is None
    assert engine.kv.leases.deadlines() == [18.0] and engine.kv.leases.renewed == 1
    clock.advance(9.9)  # 17.9: past the first deadline, before the renewed one
    assert engine.check()["leases"] == 1
    clock.advance(0.1)
    assert engine.check()["leases"] == 0


def test_a_miss_does_not_renew(make_engine, clock):
    engine = make_engine()
    engine.generate(prompt(0, 24), 4, retain_for=10)
    clock.advance(5)
    engine.generate(prompt(0, 6), 2)  # matches one page of it: the leased path is not reached
    assert engine.kv.leases.deadlines() == [10.0] and engine.kv.leases.renewed == 0


def test_the_next_turn_s_lease_takes_over_the_previous_one(make_engine, clock):
    engine = make_engine()
    ids = prompt(0, 24)
    r = engine.generate(ids, 4, retain_for=10, ignore_eos=True)
    clock.advance(3)
    engine.generate(ids + list(r.token_ids) + prompt(3, 6), 2, retain_for=20, ignore_eos=True)
    assert engine.kv.leases.deadlines() == [23.0]  # one lock holds both turns' pages
    assert engine.check()["leased_blocks"] == (24 + 4 + 6 + 1) // PAGE


def test_past_the_budget_the_oldest_lease_gives_way(make_engine, clock):
    engine = make_engine(capacity_blocks=40, lease_fraction=0.25)  # 10 pages for leases
    first = engine.generate(prompt(0, 16), 1, retain_for=30)  # 16 positions: 4 pages each
    clock.advance(1)
    second = engine.generate(prompt(1, 16), 1, retain_for=30)
    assert engine.check()["leased_blocks"] == 8
    clock.advance(1)
    third = engine.generate(prompt(2, 16), 1, retain_for=30)
    assert [r.lease for r in (first, second, third)] == [LeaseGrant(30.0, 16)] * 3  # granted, each at its end
    leases = engine.kv.leases
    assert leases.given_way == 1 and leases.deadlines() == [31.0, 32.0]  # the first gave way
    assert engine.check()["leased_blocks"] == 8


def test_a_lease_longer_than_the_budget_keeps_its_first_pages(make_engine):
    engine = make_engine(capacity_blocks=40, lease_fraction=0.25)
    r = engine.generate(prompt(0, 60), 1, retain_for=30)
    assert r.lease == LeaseGrant(30.0, 10 * PAGE)
    assert engine.check()["leased_blocks"] == 10


def test_leases_give_way_to_live_work(make_engine):
    engine = make_engine(capacity_blocks=20, lease_fraction=1.0)
    engine.generate(prompt(0, 40), 1, retain_for=100)  # 10 pages held
    engine.generate(prompt(1, 40), 1, retain_for=100)  # 10 more: the pool is all leases
    assert engine.check()["free_blocks"] == 0
    r = engine.generate(prompt(2, 44), 2)  # needs 12 pages: the oldest lease gives way, then the next
    assert r.finish_reason == "length" and engine.kv.leases.given_way == 2


def test_no_lease_without_asking_with_zero_without_a_cache_or_for_a_cancel(make_engine, tiny):
    engine = make_engine()
    assert engine.generate(prompt(0, 10), 2).lease is None
    assert engine.generate(prompt(0, 10), 2, retain_for=0).lease == NO_LEASE
    handle = engine.submit(prompt(1, 30), 50, retain_for=10, ignore_eos=True)
    handle.cancel()
    assert handle.result().lease == NO_LEASE
    assert engine.check()["leases"] == 0
    cold = make_engine(enable_cache=False)
    assert cold.generate(prompt(0, 10), 2, retain_for=10).lease == NO_LEASE
    assert cold.check()["locked_blocks"] == 0


def test_pins_keep_their_meaning_beside_leases(make_engine, clock):
    engine = make_engine()
    ids = prompt(0, 24)
    r = engine.generate(ids, 4, pin=True, retain_for=5)
    assert r.pinned_tokens == 24 and r.lease.tokens == 24  # 27 positions computed: 6 whole pages
    clock.advance(5)
    g = engine.check()
    assert g["leases"] == 0 and g["pinned_blocks"] == 6 and g["locked_blocks"] == 6  # the pin stays
    assert engine.unpin(ids) == 1 and engine.check()["locked_blocks"] == 0


def test_a_preempted_request_takes_its_lease_only_when_it_finishes(make_engine, clock):
    engine = make_engine(capacity_blocks=14, lease_fraction=0.5)
    handles = [engine.submit(prompt(i, 12), 30, retain_for=60, ignore_eos=True) for i in range(3)]
    results = [h.result() for h in handles]
    assert sum(r.preemptions for r in results) > 0
    assert all(r.lease is not None for r in results)
    check_leases(engine)
    clock.advance(60)
    assert engine.check()["locked_blocks"] == 0
