"""RouterIndex: batches applied in sequence, gaps refused whole, resyncs, removal, and consecutive matching; a
property test against a naive model of one set per replica."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixcache.router import EventBatch, RouterError, RouterIndex


def index_with(*replicas: int) -> RouterIndex:
    index = RouterIndex()
    for r in replicas:
        index.add_replica(r)
    return index


def test_batches_apply_in_order_removed_before_stored() -> None:
    index = index_with(0)
    assert index.apply(EventBatch(0, 1, stored=(1, 2, 3)))
    assert index.apply(EventBatch(0, 2, stored=(4,), removed=(3,)))
    assert index.keys(0) == {1, 2, 4}
    assert index.apply(EventBatch(0, 3, stored=(3,), removed=(3,)))  # removed first, then stored: 3 stays
    assert index.keys(0) == {1, 2, 3, 4}
    assert index.apply(EventBatch(0, 4, stored=(9,), cleared=True))  # cleared first of all
    assert index.keys(0) == {9}
    assert index.last_seq(0) == 4
    assert index.stats.batches == 4 and index.stats.events == 3 + 2 + 2 + 2


def test_a_gap_returns_false_and_changes_nothing() -> None:
    index = index_with(0)
    index.apply(EventBatch(0, 1, stored=(1, 2)))
    for seq in (1, 3, 7):  # a replay of the last batch, and batches after a missed one
        assert not index.apply(EventBatch(0, seq, stored=(5,), removed=(1,), cleared=True))
        assert index.keys(0) == {1, 2} and index.last_seq(0) == 1
    assert index.stats.gaps == 3
    assert index.apply(EventBatch(0, 2, stored=(5,)))  # the right next batch still applies


def test_unhashable_keys_raise_and_change_nothing() -> None:
    index = index_with(0)
    index.apply(EventBatch(0, 1, stored=(1,)))
    with pytest.raises(TypeError):
        index.apply(EventBatch(0, 2, stored=(2, [3]), removed=(1,)))
    assert index.keys(0) == {1} and index.last_seq(0) == 1


def test_resync_replaces_the_set_and_the_sequence() -> None:
    index = index_with(0)
    index.apply(EventBatch(0, 1, stored=(1, 2)))
    assert not index.apply(EventBatch(0, 5, stored=(3,)))  # a gap: the caller asks for a snapshot
    index.resync(0, 9, [7, 8])
    assert index.keys(0) == {7, 8} and index.last_seq(0) == 9
    assert not index.apply(EventBatch(0, 5, stored=(3,)))
    assert index.apply(EventBatch(0, 10, removed=(7,)))
    assert index.keys(0) == {8}
    with pytest.raises(RouterError):
        index.resync(3, 1, [1])  # not indexed: add it first


def test_remove_replica_drops_it_at_once() -> None:
    index = index_with(0, 1)
    index.apply(EventBatch(1, 1, stored=(1, 2)))
    assert index.remove_replica(1)
    assert index.replicas() == (0,) and 1 not in index
    assert index.matched_pages(1, [1, 2]) == 0 and index.pages(1) == 0
    assert not index.apply(EventBatch(1, 2, stored=(3,)))  # a late batch from the dead replica
    assert not index.remove_replica(1)
    index.add_replica(1)  # back, empty, expecting its batch 1
    assert index.pages(1) == 0 and index.apply(EventBatch(1, 1, stored=(4,)))
    with pytest.raises(RouterError):
        index.add_replica(1)


def test_matched_pages_counts_consecutive_keys_from_the_first() -> None:
    index = index_with(0)
    index.apply(EventBatch(0, 1, stored=(b"a", b"b", b"d")))
    assert index.matched_pages(0, [b"a", b"b", b"c", b"d"]) == 2  # stops at the first key it lacks
    assert index.matched_pages(0, [b"b", b"a"]) == 2
    assert index.matched_pages(0, [b"x", b"a"]) == 0
    assert index.matched_pages(0, []) == 0


def test_matched_pages_stops_at_the_first_miss() -> None:
    class Keys:
        def __init__(self) -> None:
            self.read = 0

        def __iter__(self):
            for key in (1, 2, 99, 3, 4):
                self.read += 1
                yield key

    index = index_with(0)
    index.apply(EventBatch(0, 1, stored=(1, 2, 3, 4)))
    keys = Keys()
    assert index.matched_pages(0, keys) == 2  # type: ignore[arg-type]
    assert keys.read == 3  # O(answer): never looks past the first miss


def test_event_batch_validates_its_numbers() -> None:
    with pytest.raises(RouterError):
        EventBatch(0, 0)
    with pytest.raises(RouterError):
        EventBatch(-1, 1)
    assert EventBatch(0, 1, stored=[1, 2]).stored == (1, 2)  # type: ignore[arg-type]


def test_memory_and_sizes() -> None:
    index = index_with(0, 1)
    index.apply(EventBatch(0, 1, stored=tuple(bytes([i]) * 16 for i in range(100))))
    assert index.pages(0) == 100 and index.total_pages() == 100
    assert index.memory_bytes() > 100 * 16


# ---------------------------------------------------------------------------------------------- the property test

replica_ids = st.integers(0, 3)
keys = st.integers(0, 12)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), replica_ids),
        st.tuples(st.just("remove"), replica_ids),
        st.tuples(
            st.just("batch"),
            replica_ids,
            st.integers(-1, 2),  # offset from the next sequence number: 0 is in order, anything else a gap
            st.lists(keys, max_size=5),
            st.lists(keys, max_size=5),
            st.booleans(),
        ),
        st.tuples(st.just("resync"), replica_ids, st.integers(0, 50), st.frozensets(keys, max_size=6)),
        st.tuples(st.just("match"), replica_ids, st.lists(keys, max_size=8)),
    ),
    max_size=60,
)


@given(operations)
def test_index_equals_a_naive_model_under_random_batches_gaps_and_resyncs(ops: list[tuple]) -> None:
    index = RouterIndex()
    model: dict[int, tuple[set, int]] = {}  # replica -> (keys, last seq)
    for op in ops:
        kind, r = op[0], op[1]
        if kind == "add":
            if r in model:
                with pytest.raises(RouterError):
                    index.add_replica(r)
            else:
                index.add_replica(r)
                model[r] = (set(), 0)
        elif kind == "remove":
            assert index.remove_replica(r) == (r in model)
            model.pop(r, None)
        elif kind == "batch":
            _, _, offset, stored, removed, cleared = op
            seq = (model[r][1] if r in model else 0) + 1 + offset
            if seq < 1:
                continue
            ok = index.apply(EventBatch(r, seq, tuple(stored), tuple(removed), cleared))
            expected = r in model and offset == 0
            assert ok == expected
            if expected:
                held = set() if cleared else set(model[r][0])
                held -= set(removed)
                held |= set(stored)
                model[r] = (held, seq)
        elif kind == "resync":
            _, _, seq, snapshot = op
            if r in model:
                index.resync(r, seq, snapshot)
                model[r] = (set(snapshot), seq)
            else:
                with pytest.raises(RouterError):
                    index.resync(r, seq, snapshot)
        else:
            wanted = op[2]
            held = model[r][0] if r in model else set()
            n = 0
            while n < len(wanted) and wanted[n] in held:
                n += 1
            assert index.matched_pages(r, wanted) == n
        assert index.replicas() == tuple(sorted(model))
        for replica, (held, seq) in model.items():
            assert index.keys(replica) == held
            assert index.last_seq(replica) == seq
            assert index.pages(replica) == len(held)
        assert index.total_pages() == sum(len(h) for h, _ in model.values())
