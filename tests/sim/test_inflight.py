"""Requests in flight: counted (`concurrency`) for traces that do not say when a request finished, timed for traces an
engine recorded (`finish_timestamp`), where a request's prompt is shared from its start, as the engine shares it."""

from __future__ import annotations

import random

import pytest

from radixcache.sim.cache_replay import CacheReplay
from radixcache.sim.infinite_replay import InfiniteReplay
from radixcache.sim.inflight import InFlight
from radixcache.sim.results import BELADY
from radixcache.sim.simulation import simulate, simulate_infinite
from radixcache.trace.workload import SimRequest, Workload, hash_sim_request


def test_items_finish_by_their_times_and_the_rest_first_in_first_out() -> None:
    flight = InFlight(concurrency=2)
    flight.add("late", 30.0)
    flight.add("early", 10.0)
    flight.add("fifo-1", None)
    assert list(flight.due(5.0)) == []  # one counted item is under the concurrency, nothing timed is done
    flight.add("fifo-2", None)
    assert list(flight.due(10.0)) == ["early", "fifo-1"]  # done at the arrival's time, then the counted overflow
    assert len(flight) == 2
    assert list(flight.drain()) == ["late", "fifo-2"]
    assert len(flight) == 0


def _recorded(t: float, finish: float | None, prompt: tuple[int, ...], output: tuple[int, ...] = ()) -> SimRequest:
    """A request as an engine records it, at 4 tokens a page: its prompt's whole pages then its output pages."""
    return hash_sim_request(t, (*prompt, 999), 4 * len(prompt) + 1, 4, output, None, 1, finish)


def _workload(*requests: SimRequest) -> Workload:
    return Workload(tuple(requests), 1, 4, "hash")


def test_a_request_that_arrives_while_another_runs_reads_the_prompt_pages_it_shares() -> None:
    """B arrives at 5 ms while A (same 3-page system prompt) runs until 100 ms: the engine shares A's prompt pages as
    it computes them, so B hits them. A trace without finish times keeps A's pages until A finishes: B misses."""
    a = _recorded(0, 100, (1, 2, 3, 4))
    b = _recorded(5, 110, (1, 2, 3, 7))
    shared = simulate(_workload(a, b), 64, concurrency=1, check=True)
    assert shared.hit_blocks == 3 and shared.hit_tokens == 12
    untimed = _workload(a._replace(finish_ms=None), b._replace(finish_ms=None))
    assert simulate(untimed, 64, concurrency=2, check=True).hit_blocks == 0


def test_a_next_turn_after_its_predecessor_finished_reads_the_answer_whatever_the_concurrency() -> None:
    """Turn 1 finishes at 50 ms, turn 2 (its prompt holds turn 1 and its answer) arrives at 60 ms. Counted at
    concurrency 4, turn 1 would still be in flight and its answer not cached; timed, turn 2 reads all of it."""
    turn1 = _recorded(0, 50, (1, 2), output=(3, 4))
    turn2 = _recorded(60, 70, (1, 2, 3, 4, 5))
    for concurrency in (1, 4):
        assert simulate(_workload(turn1, turn2), 64, concurrency=concurrency, check=True).hit_blocks == 4
    counted = _workload(turn1._replace(finish_ms=None), turn2._replace(finish_ms=None))
    assert simulate(counted, 64, concurrency=4, check=True).hit_blocks == 0  # turn 1 still in flight: nothing yet


def _overlapping(seed: int, n: int = 60) -> Workload:
    """Conversations over 3 system prompts, several in flight at once, each turn after its predecessor's finish."""
    rng = random.Random(seed)
    history = {c: (100 * (c % 3), 100 * (c % 3) + 1) for c in range(6)}  # two system-prompt pages each
    free_at = dict.fromkeys(history, 0.0)
    requests, t, next_id = [], 0.0, 1000
    for _ in range(n):
        c = rng.randrange(6)
        t = max(t + rng.uniform(0, 3), free_at[c])
        prompt = (*history[c], *range(next_id, next_id + rng.randrange(1, 4)))
        output = tuple(range(next_id + 10, next_id + 10 + rng.randrange(0, 3)))
        next_id += 20
        finish = t + rng.uniform(1, 20)
        requests.append(_recorded(t, finish, prompt, output))
        history[c] = prompt + output
        free_at[c] = finish
    requests.sort(key=lambda r: r.timestamp_ms)
    return _workload(*requests)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_infinite_bound_follows_the_same_timing_as_a_tree_that_never_evicts(seed: int) -> None:
    w = _overlapping(seed)
    tree = simulate(w, 10_000, check=True)
    assert tree.evicted_blocks == 0
    for chained in (False, True):  # by hash id, and by sequence
        replay = InfiniteReplay(w, chained=chained)
        for index, request in enumerate(w):
            replay.feed(index, request)
        replay.close()
        assert (replay.result().hit_tokens, replay.result().hit_blocks) == (tree.hit_tokens, tree.hit_blocks)
    assert simulate_infinite(w).hit_tokens == tree.hit_tokens


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("capacity", [8, 20])
def test_bounds_keep_their_order_on_overlapping_recorded_requests(seed: int, capacity: int) -> None:
    w = _overlapping(seed)
    lru = simulate(w, capacity, check=True)
    belady = simulate(w, capacity, BELADY, check=True)
    assert lru.evicted_blocks > 0
    assert lru.hit_tokens <= belady.hit_tokens <= simulate_infinite(w).hit_tokens


def test_a_pinned_prompt_is_never_evicted_while_its_request_runs() -> None:
    """A runs long; B and C arrive while it runs and need room: the tree may evict anything but A's pages."""
    a = _recorded(0, 1000, (1, 2, 3))
    b = _recorded(1, 2, (10, 11, 12))
    c = _recorded(3, 4, (20, 21, 22))
    d = _recorded(1001, 1002, (1, 2, 3, 4))
    replay = CacheReplay(_workload(a, b, c, d), 6, check=True)
    for index, request in enumerate((a, b, c, d)):
        replay.feed(index, request)
    replay.close()
    assert replay.result().hit_blocks == 3  # d reads all of a's prompt, pinned through b's and c's evictions
