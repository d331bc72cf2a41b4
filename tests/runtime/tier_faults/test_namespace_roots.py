"""Per-namespace caches stay bounded however many namespaces (per-tenant `cache_salt` values) pass through: the
page hasher's cached chain roots (radixcache.page_hash.PageHasher) and the tree's namespace roots
(radixcache.cache.RadixCache), while the hashes stay exactly the uncached ones (radixcache.page_hash.page_hashes).
"""

from __future__ import annotations

from radixcache import RadixCache
from radixcache.page_hash import MAX_CACHED_ROOTS, PageHasher, page_hashes


def test_a_thousand_salts_leave_a_bounded_set_of_page_hash_roots() -> None:
    hasher = PageHasher("model#fp", 4)
    tokens = list(range(12))
    for i in range(1000):
        salt = ("tenant", f"salt-{i}")
        assert hasher.hashes(tokens, salt) == page_hashes(tokens, 4, "model#fp", salt)
        assert hasher.chain(salt).upto(tokens, 3) == page_hashes(tokens, 4, "model#fp", salt)
    assert len(hasher._roots) <= MAX_CACHED_ROOTS < 1000
    # a namespace used again after it was dropped gets the same root
    assert hasher.hashes(tokens, ("tenant", "salt-0")) == page_hashes(tokens, 4, "model#fp", ("tenant", "salt-0"))


def test_a_hot_namespace_keeps_its_hashes_among_many_cold_ones() -> None:
    hasher = PageHasher("fp", 1)
    want = page_hashes([5, 6], 1, "fp", None)
    for i in range(3 * MAX_CACHED_ROOTS):
        assert hasher.hashes([5, 6], None) == want  # the default namespace, used all the time
        hasher.root(f"cold-{i}")
    assert len(hasher._roots) <= MAX_CACHED_ROOTS


def test_the_tree_keeps_roots_only_for_namespaces_it_holds() -> None:
    cache = RadixCache(20, page_size=1)
    for i in range(1000):
        ns = f"salt-{i}"
        cache.match_prefix([1, 2, 3], namespace=ns)
        cache.insert([1, 2, 3], cache.allocate(3), namespace=ns)
    assert len(cache._roots) <= 20 // 3 + 1
    cache.check_invariants()
