"""When a replayed lease runs (radixcache.sim.lease_replay): from the end of its request (its recorded finish, else its
arrival), for its hint's seconds, renewed by the session's next arrival; not from the later arrival whose admission
finishes the request in the replay's in-flight model."""

from __future__ import annotations

from pathlib import Path

from radixcache.sim.lease_replay import LeaseReplay
from radixcache.trace import HashRequest, write_mooncake
from radixcache.trace.records import TokenRequest
from radixcache.trace.workload import load_workload, token_workload


def _fed(workload, hints: list, capacity: int, upto: int | None = None) -> LeaseReplay:
    replay = LeaseReplay(workload, capacity, "lru", hints, budget=1.0, check=True)
    for index, request in enumerate(workload.requests[:upto]):
        replay.feed(index, request)
    return replay


def test_a_lease_runs_from_its_requests_end_not_from_the_arrival_that_finishes_it() -> None:
    """Regression: a request at 0 s with a 5 s hint finished (in the in-flight model) at the next arrival, 4 s, and
    its lease ran to 4 + 5 = 9 s: at 6 s it still held its 4 pages, and the 6 s request, which needs the whole
    cache, had to leave them and could cache only what remained. The lease is the 5 s after the request (to 5 s)."""
    a = TokenRequest(0.0, (1,) * 4, 0, "a", output_tokens=())
    b = TokenRequest(4000.0, (2,) * 2, 0, "b", output_tokens=())
    c = TokenRequest(6000.0, (3,) * 8, 0, "c", output_tokens=())
    replay = _fed(token_workload([a, b, c]), [5.0, None, None], capacity=8)
    assert replay.granted == 1 and replay.expired == 1 and not replay.leases  # released before c arrived
    assert replay.cache.peek(a.tokens).length == 0  # c's allocation evicted a's pages
    replay.close()
    assert replay.cache.peek(c.tokens).length == 8  # c cached whole: nothing leased was in its way


def test_a_lease_that_ran_out_before_the_arrival_that_finishes_it_holds_nothing() -> None:
    """Regression: a 2 s lease on a request at 0 s whose next arrival came at 10 s was granted at 10 s to 12 s, so it
    held its pages through the 10 s request's allocation. It ran out at 2 s: counted granted and expired, no lock."""
    a = TokenRequest(0.0, (1,) * 4, 0, "a", output_tokens=())
    c = TokenRequest(10000.0, (3,) * 8, 0, "c", output_tokens=())
    replay = _fed(token_workload([a, c]), [2.0, None], capacity=8)
    assert (replay.granted, replay.expired, replay.leases) == (1, 1, {})
    replay.close()
    assert replay.cache.peek(c.tokens).length == 8


def test_the_sessions_next_arrival_renews_its_lease_from_that_arrival() -> None:
    """An agent's next step at 3 s finds the 4 s lease of its first step running and renews it to 3 + 4 = 7 s (as the
    engine's match does): at 6 s it still runs, and the step's own lease has taken its place."""
    first = TokenRequest(0.0, (1,) * 4, 0, "a", output_tokens=())
    second = TokenRequest(3000.0, (1,) * 4 + (2,) * 4, 0, "a", output_tokens=())
    other = TokenRequest(6000.0, (5,), 0, "b", output_tokens=())
    replay = _fed(token_workload([first, second, other]), [4.0, 4.0, None], capacity=40)
    assert replay.renewed == 1 and replay.expired == 0
    assert [deadline for deadline, *_ in replay.leases.values()] == [7000.0]
    replay.close()


def test_a_recorded_finish_starts_the_lease(tmp_path: Path) -> None:
    """A recorded trace says when each request left the engine (finish_timestamp): its lease runs from then. A 1 s
    lease on a request that ran from 0 to 3 s still holds at 3.5 s (to 4 s), and is gone at 4.5 s."""
    path = tmp_path / "r.jsonl"
    ids = [(1, 2), (3,), (4,)]
    write_mooncake(
        path,
        [
            HashRequest(0.0, 32, 1, ids[0], block_size=16, finish_timestamp_ms=3000.0, retain_for=1.0),
            HashRequest(3500.0, 16, 1, ids[1], block_size=16, finish_timestamp_ms=3600.0),
            HashRequest(4500.0, 16, 1, ids[2], block_size=16, finish_timestamp_ms=4600.0),
        ],
    )
    workload = load_workload(path)
    held = _fed(workload, [], capacity=10, upto=2)
    assert held.granted == 1 and [d for d, *_ in held.leases.values()] == [4000.0]
    gone = _fed(workload, [], capacity=10)
    assert gone.expired == 1 and not gone.leases
    gone.close()
