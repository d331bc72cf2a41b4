"""Namespaces (tenants) are isolated: identical tokens never share blocks across them."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pytest

from radixcache import BlockStateError, RadixCache


def put(cache: RadixCache, tokens: Sequence[int], namespace: Hashable = None) -> list[int]:
    blocks = cache.allocate(-(-len(tokens) // cache.page_size))
    cache.insert(tokens, blocks, namespace=namespace)
    return blocks


def test_match_in_one_namespace_never_sees_another() -> None:
    cache = RadixCache(16)
    put(cache, [1, 2, 3], namespace="alice")

    assert cache.match_prefix([1, 2, 3], namespace="bob").length == 0
    assert cache.match_prefix([1, 2, 3]).length == 0  # the default namespace is a namespace too
    assert cache.match_prefix([1, 2, 3], namespace="alice").length == 3


def test_same_tokens_in_two_namespaces_keep_separate_blocks() -> None:
    cache = RadixCache(16)
    alice = put(cache, [1, 2, 3], namespace="alice")
    bob_blocks = cache.allocate(3)

    assert cache.insert([1, 2, 3], bob_blocks, namespace="bob") == 0  # nothing reused from alice

    assert cache.match_prefix([1, 2, 3], namespace="alice").blocks == alice
    assert cache.match_prefix([1, 2, 3], namespace="bob").blocks == bob_blocks
    assert set(alice).isdisjoint(bob_blocks)
    assert cache.evictable_blocks == 6
    cache.check_invariants()


def test_a_split_in_one_namespace_leaves_the_other_untouched() -> None:
    cache = RadixCache(16)
    put(cache, [1, 2, 3, 4], namespace=0)
    put(cache, [1, 2, 3, 4], namespace=1)

    cache.match_prefix([1, 2], namespace=0)

    by_namespace = sorted((node.namespace, node.tokens()) for node in cache.iter_nodes())
    assert by_namespace == [(0, [1, 2]), (0, [1, 2, 3, 4]), (1, [1, 2, 3, 4])]


def test_a_lock_in_one_namespace_does_not_protect_the_same_tokens_in_another() -> None:
    cache = RadixCache(16)
    put(cache, [5, 6], namespace="a")
    put(cache, [5, 6], namespace="b")
    cache.lock(cache.match_prefix([5, 6], namespace="a").node)

    assert cache.evict(16) == 2

    assert cache.match_prefix([5, 6], namespace="a").length == 2
    assert cache.match_prefix([5, 6], namespace="b").length == 0


def test_tree_blocks_of_another_namespace_are_not_accepted_as_cached_pages() -> None:
    cache = RadixCache(16)
    alice = put(cache, [1, 2], namespace="alice")
    put(cache, [1, 2], namespace="bob")

    with pytest.raises(BlockStateError):
        cache.insert([1, 2], alice, namespace="bob")
    assert cache.match_prefix([1, 2], namespace="alice").blocks == alice


def test_lookups_under_unseen_namespaces_leave_nothing_behind() -> None:
    cache = RadixCache(16)
    put(cache, [1, 2, 3], namespace="alice")
    for salt in range(50):
        m = cache.match_prefix([1, 2, 3], namespace=f"user-{salt}")
        assert m.length == 0
        cache.lock(m.node)  # the empty match's root: a no-op, like any root
        cache.unlock(m.node)
    assert cache.namespaces() == ["alice"]
    cache.check_invariants()


def test_a_namespace_whose_last_node_is_evicted_keeps_no_root() -> None:
    cache = RadixCache(16)
    put(cache, [1, 2, 3], namespace="alice")
    put(cache, [4, 5], namespace="bob")
    stale = cache.match_prefix([1], namespace="alice")  # an empty-ish handle taken before the eviction
    assert cache.evict(cache.evictable_blocks) == 5
    assert cache.namespaces() == []
    with pytest.raises(Exception, match="evicted"):
        cache.lock(stale.node)
    put(cache, [1, 2, 3], namespace="alice")  # the namespace comes back on the next insert
    assert cache.namespaces() == ["alice"]
    assert cache.match_prefix([1, 2, 3], namespace="alice").length == 3
    cache.check_invariants()


def test_a_namespace_unequal_to_itself_is_its_own_and_passes_the_check() -> None:
    """NaN keys the roots as a dict keys it, by identity: the same object matches, a fresh NaN does not. The
    invariant checker compared with == alone and reported a sound tree as corrupt."""
    cache = RadixCache(8)
    nan = float("nan")
    cache.insert([1, 2], cache.allocate(2), namespace=nan)
    cache.check_invariants()
    assert cache.match_prefix([1, 2], namespace=nan).length == 2
    assert cache.match_prefix([1, 2], namespace=float("nan")).length == 0
    assert cache.evict(2) == 2 and cache.namespaces() == []
    cache.check_invariants()


@pytest.mark.parametrize("tokens", [[], [7], [7, 8, 9]])
def test_an_insert_of_no_whole_page_leaves_no_namespace_behind(tokens: list[int]) -> None:
    """Regression: an insert shorter than a page (or empty) under an unseen namespace registered its root, which held
    nothing and never went (a root goes with its last node): namespaces() listed it, and per-request salts with
    short requests grew the roots without bound."""
    cache = RadixCache(16, page_size=4)
    put(cache, [1, 2, 3, 4], namespace="alice")
    for salt in range(20):
        blocks = put(cache, tokens, namespace=f"user-{salt}")
        assert cache.match_prefix(tokens, namespace=f"user-{salt}").length == 0
        cache.free(blocks)  # the tail page stays with the caller
    assert cache.namespaces() == ["alice"] and len(cache._roots) == 1
    put(cache, [5, 6, 7, 8, 9], namespace="bob")  # a whole page: the namespace holds it
    assert cache.namespaces() == ["alice", "bob"]
    cache.check_invariants()
