"""One poll round asks every replica for its events at once, and never waits on a replica's sync lock: asked in
turn, N frozen replicas held each round N x POLL_WAIT_S (every other replica's events and rejoin with them), and a
request's sync holding a replica's lock (waiting call_timeout on a replica that froze) held the whole poller as
long; and a pull a round did not get its answer to stays outstanding, not waited for by later rounds (each round
waited its whole bound for a frozen replica). Stand-in replicas (tests/cluster/stand_in.py)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import pytest

from radixcache.router import EventBatch
from tests.cluster.stand_in import install

HANG_S = 30.0  # a bound on a hang, never reached with the fix


def _cluster(monkeypatch: pytest.MonkeyPatch, replicas: int) -> Any:
    install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster

    return ReplicaCluster("fake", replicas, router="round_robin", poll_interval=None, call_timeout=600.0)


def test_a_round_asks_every_replica_before_it_waits_on_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replica 0 answers only once replica 1 has been asked: asked in turn, it ran out of the round's wait."""
    cluster = _cluster(monkeypatch, 2)
    answer_0: Future[Any] = Future()
    cluster.actor(0)._events_since = lambda seq: answer_0
    news_1 = cluster.actor(1)._events_since

    def events_1(seq: int) -> Any:
        answer_0.set_result(("i0", [EventBatch(0, 1, stored=(b"a" * 16,))]))
        return news_1(seq)

    cluster.actor(1)._events_since = events_1
    cluster.actor(1).batches = [EventBatch(1, 1, stored=(b"b" * 16,))]
    try:
        cluster.poll(2.0)
        assert (cluster.index.pages(0), cluster.index.pages(1)) == (1, 1)
    finally:
        if not answer_0.done():
            answer_0.set_result(("i0", []))
        cluster.close()


def test_a_round_leaves_a_replica_whose_sync_is_held_and_serves_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = _cluster(monkeypatch, 2)
    cluster.actor(1).batches = [EventBatch(1, 1, stored=(b"b" * 16,))]
    held = cluster._sync_locks[0]
    held.acquire()  # a request's sync on replica 0, waiting on it
    try:
        poller = threading.Thread(target=cluster.poll, args=(2.0,), daemon=True)
        poller.start()
        poller.join(HANG_S)
        assert not poller.is_alive(), "the round waited for replica 0's sync lock"
        assert cluster.index.pages(1) == 1
    finally:
        held.release()
        cluster.close()


def test_a_round_waiting_on_a_frozen_replica_holds_no_other_replicas_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request finishing on replica 0 syncs it on its way out: the round, waiting on frozen replica 1, must not
    hold replica 0's sync lock until it ends (that request's result waited up to the round's whole bound)."""
    cluster = _cluster(monkeypatch, 2)
    never: Future[Any] = Future()
    asked_1 = threading.Event()

    def frozen(seq: int) -> Future[Any]:
        asked_1.set()
        return never

    cluster.actor(1)._events_since = frozen
    news = [EventBatch(0, 1, stored=(b"a" * 16,))]
    cluster.actor(0)._events_since = lambda seq: ("i0", [b for b in news if b.seq > seq])  # as a replica's
    poller = threading.Thread(target=cluster.poll, args=(4 * HANG_S,), daemon=True)
    try:
        poller.start()
        assert asked_1.wait(HANG_S)
        request_sync = threading.Thread(target=cluster.sync, args=(0,), daemon=True)
        request_sync.start()
        request_sync.join(HANG_S)
        assert not request_sync.is_alive() and poller.is_alive(), "replica 0's sync waited for the round to end"
        assert cluster.index.pages(0) == 1
    finally:
        never.set_result(("i1", []))
        poller.join(HANG_S)
        cluster.close()


def test_a_replica_whose_pull_hangs_is_not_waited_for_by_later_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replica 0's pull never answers: every round after the first brings replica 1's new pages into the index
    without waiting on replica 0 (each round waited its whole bound for it: the others' pages reached the index
    once per that bound), replica 0 is asked once, and its late answer is applied by the round that finds it."""
    cluster = _cluster(monkeypatch, 2)
    never: Future[Any] = Future()
    asked_0: list[int] = []

    def frozen(seq: int) -> Future[Any]:
        asked_0.append(seq)
        return never

    cluster.actor(0)._events_since = frozen
    news: list[EventBatch] = []
    cluster.actor(1)._events_since = lambda seq: ("i1", [b for b in news if b.seq > seq])  # as a replica's
    try:
        cluster.poll(0.2)  # replica 0 is asked, and does not answer within the round
        for seq in range(1, 4):
            news.append(EventBatch(1, seq, stored=(bytes([seq]) * 16,)))
            poller = threading.Thread(target=cluster.poll, args=(4 * HANG_S,), daemon=True)
            poller.start()
            poller.join(HANG_S)
            assert not poller.is_alive(), "the round waited for replica 0's outstanding pull"
            assert cluster.index.holds(1, bytes([seq]) * 16) and cluster.index.last_seq(1) == seq
        assert asked_0 == [0] and cluster.index.pages(0) == 0
        never.set_result(("i0", [EventBatch(0, 1, stored=(b"a" * 16,))]))
        cluster.poll(2.0)
        assert cluster.index.holds(0, b"a" * 16) and cluster.index.last_seq(0) == 1
        assert cluster.alive == (0, 1)
    finally:
        if not never.done():
            never.set_result(("i0", []))
        cluster.close()


def test_a_restarting_replica_whose_info_hangs_holds_no_later_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replica 0 died and Ray is restarting it (its info call answers only once it is back): later rounds bring
    replica 1's new pages in without waiting on it, and replica 0 rejoins in the round that finds its answer."""
    cluster = _cluster(monkeypatch, 2)
    back: Future[Any] = Future()
    infos: list[int] = []

    def restarting() -> Future[Any]:
        infos.append(0)
        return back

    cluster.actor(0)._info = restarting
    news: list[EventBatch] = []
    cluster.actor(1)._events_since = lambda seq: ("i1", [b for b in news if b.seq > seq])
    try:
        cluster.mark_dead(0, RuntimeError("its actor died"))  # as a failed call finds it
        cluster.poll(0.2)
        for seq in range(1, 3):
            news.append(EventBatch(1, seq, stored=(bytes([seq]) * 16,)))
            poller = threading.Thread(target=cluster.poll, args=(4 * HANG_S,), daemon=True)
            poller.start()
            poller.join(HANG_S)
            assert not poller.is_alive(), "the round waited for the restarting replica's info"
            assert cluster.index.holds(1, bytes([seq]) * 16)
        assert infos == [0] and cluster.alive == (1,)
        back.set_result({"incarnation": "i0-restarted"})
        cluster.poll(2.0)
        assert cluster.alive == (0, 1) and cluster.index.pages(0) == 0
    finally:
        if not back.done():
            back.set_result({"incarnation": "i0"})
        cluster.close()


def test_a_resync_whose_snapshot_hangs_holds_no_later_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replica 0 answers its pull with a gap, then its snapshot never answers: the round that asked the snapshot
    and later ones bring replica 1's new pages in without waiting on it (each round waited its whole bound for the
    snapshot, and asked it again), and the snapshot's late answer resyncs replica 0."""
    cluster = _cluster(monkeypatch, 2)
    late: Future[Any] = Future()
    snapshots: list[int] = []

    def frozen() -> Future[Any]:
        snapshots.append(0)
        return late

    cluster.actor(0)._snapshot = frozen
    cluster.actor(0).batches = None  # a gap: the batches the index needs are no longer kept
    news: list[EventBatch] = []
    cluster.actor(1)._events_since = lambda seq: ("i1", [b for b in news if b.seq > seq])
    try:
        for seq in range(1, 4):
            news.append(EventBatch(1, seq, stored=(bytes([seq]) * 16,)))
            poller = threading.Thread(target=cluster.poll, args=(4 * HANG_S if seq > 1 else 0.2,), daemon=True)
            poller.start()
            poller.join(HANG_S)
            assert not poller.is_alive(), "the round waited for replica 0's snapshot"
            assert cluster.index.holds(1, bytes([seq]) * 16)
        assert snapshots == [0] and cluster.index.pages(0) == 0
        late.set_result(("i0", 7, frozenset({b"s" * 16})))
        cluster.poll(2.0)
        assert cluster.index.holds(0, b"s" * 16) and cluster.index.last_seq(0) == 7
    finally:
        if not late.done():
            late.set_result(("i0", 0, frozenset()))
        cluster.close()
