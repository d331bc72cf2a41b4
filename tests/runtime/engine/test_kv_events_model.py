"""The engine's cache event log (runtime.kv.events.KVEventLog) and the router's index (radixcache.router.RouterIndex)
against an independent recompute, under random inserts, evictions (whole leaves and partial), namespaces, a short
kept history, lost answers and dropped batches: after every pull the receiver's set is exactly the page keys of the
tree, recomputed from its nodes, and a receiver that missed a batch or fell behind the history resyncs from a
snapshot."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache import CacheFullError, RadixCache
from radixcache.page_hash import chain_hashes, root_hash
from radixcache.router import RouterIndex
from radixcache.runtime.kv.events import KVEventLog

PAGE = 2
FINGERPRINT = "fp"

sequences = st.lists(st.integers(0, 2), min_size=1, max_size=5).map(lambda pages: [t for p in pages for t in (p, 9)])
operations = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), sequences, st.sampled_from([None, "tenant"])),
        st.tuples(st.just("evict"), st.integers(1, 6)),
        st.tuples(st.just("pull"), st.sampled_from(["apply", "lose", "drop_first"])),
        st.tuples(st.just("history"), st.integers(1, 4)),
    ),
    max_size=40,
)


def _tree_keys(cache: RadixCache) -> set[bytes]:
    keys: set[bytes] = set()
    for node in cache.iter_nodes():
        path = chain_hashes(node.tokens(), PAGE, root_hash(FINGERPRINT, node.namespace))
        keys.update(path[node.prefix_len // PAGE :])
    return keys


@settings(max_examples=300, deadline=None)
@given(operations, st.integers(4, 12))
def test_a_receiver_of_the_events_holds_exactly_the_trees_page_keys(ops: list[tuple], capacity: int) -> None:
    cache = RadixCache(capacity, page_size=PAGE)
    log = KVEventLog(cache, FINGERPRINT, replica=0, history=4)
    index = RouterIndex()
    index.add_replica(0)
    resyncs = 0
    for op in ops:
        if op[0] == "insert":
            _, tokens, namespace = op
            try:
                blocks = cache.allocate(len(tokens) // PAGE)
            except CacheFullError:
                continue
            cache.insert(tokens, blocks, namespace=namespace)
            log.stored(chain_hashes(tokens, PAGE, root_hash(FINGERPRINT, namespace)))
        elif op[0] == "evict":
            cache.evict(op[1])
        elif op[0] == "history":
            log.set_history(op[1])
        else:
            batches = log.since(index.last_seq(0))
            lost = op[1] == "lose" or (op[1] == "drop_first" and batches is not None and len(batches) == 1)
            if lost:  # the answer (or its only batch) never arrived: the next pull asks again from the same seq
                continue
            if op[1] == "drop_first" and batches:
                batches = batches[1:]  # a batch lost on the way: the next one is a gap
            if batches is None or not all(index.apply(b) for b in batches):
                seq, keys = log.snapshot()
                index.resync(0, seq, keys)
                resyncs += 1
            assert index.keys(0) == _tree_keys(cache)
            assert index.last_seq(0) == log.seq
        assert len(log) == len(_tree_keys(cache))  # the log counts exactly the tree's pages between pulls too
