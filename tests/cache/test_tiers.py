"""The host tier and the tiered cache: page hashes, the PageTier's LRU and locks, the three write policies, and a
hypothesis state machine that moves fake page contents through device, host and lower tier and checks that every
page served from any tier holds exactly the content of the prefix it is matched for."""

from __future__ import annotations

import gc
import weakref

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from radixcache import RadixCache
from radixcache.errors import LockError, RadixCacheError
from radixcache.page_hash import PageChain, page_hashes, root_hash
from radixcache.tier.page_tier import PageTier
from radixcache.tier.tiered_cache import WRITE_POLICIES, TieredCache

# ---------------------------------------------------------------------------------------------- page hashes


def test_page_hashes_chain_on_the_whole_prefix() -> None:
    a = page_hashes([1, 2, 3, 4, 5, 6], 2)
    b = page_hashes([9, 9, 3, 4, 5, 6], 2)
    assert len(a) == 3 and len(set(a)) == 3
    assert a[0] != b[0] and a[1] != b[1] and a[2] != b[2]  # the same page after a different prefix differs
    assert page_hashes([1, 2, 3], 2) == a[:1]  # only full pages


def test_page_hashes_root_separates_fingerprints_and_namespaces() -> None:
    tokens = [5, 6, 7, 8]
    base = page_hashes(tokens, 2, "model-a", None)
    assert page_hashes(tokens, 2, "model-b", None)[0] != base[0]
    assert page_hashes(tokens, 2, "model-a", "tenant")[0] != base[0]
    assert root_hash("x", None) != root_hash("x", "None")  # repr keeps None and "None" apart


def test_page_chain_grows_incrementally_to_the_same_hashes() -> None:
    tokens = list(range(40))
    chain = PageChain(root_hash("fp", None), 4)
    assert chain.upto(tokens, 3) == page_hashes(tokens, 4, "fp")[:3]
    assert chain.upto(tokens, 10) == page_hashes(tokens, 4, "fp")
    assert chain.upto(tokens, 2) == page_hashes(tokens, 4, "fp")[:2]


# ---------------------------------------------------------------------------------------------- PageTier


def test_page_tier_evicts_the_least_recently_used_unlocked_page() -> None:
    evicted = []
    tier = PageTier(2, on_evict=lambda h, slot: evicted.append(h))
    assert tier.store(b"a") == (0, True)
    assert tier.store(b"b") == (1, True)
    assert tier.count_prefix([b"a"]) == 1  # a is now more recent than b
    slot, new = tier.store(b"c")
    assert new and evicted == [b"b"] and slot == 1
    assert tier.store(b"a") == (0, False)
    tier.check_invariants()


def test_page_tier_locked_pages_stay_and_a_full_locked_tier_refuses() -> None:
    tier = PageTier(2)
    tier.store(b"a")
    tier.store(b"b")
    tier.lock([b"a", b"b"])
    assert tier.store(b"c") is None
    assert tier.locked_count == 2 and tier.free_count == 0
    with pytest.raises(LockError):
        tier.discard(b"a")
    tier.unlock([b"a"])
    assert tier.store(b"c") == (0, True)  # a was the only unlocked page
    with pytest.raises(LockError):
        tier.unlock([b"a"])  # no longer locked: refused, nothing changes
    with pytest.raises(LockError):
        tier.lock([b"zzz"])
    tier.check_invariants()


def test_page_tier_count_prefix_stops_at_the_first_gap() -> None:
    tier = PageTier(4)
    for h in (b"1", b"2", b"4"):
        tier.store(h)
    assert tier.count_prefix([b"1", b"2", b"3", b"4"]) == 2
    assert tier.count_prefix([b"1", b"2", b"3", b"4"], 3) == 1
    assert tier.stats.hit_pages == 3


def test_page_tier_rejects_a_bad_capacity() -> None:
    with pytest.raises(RadixCacheError, match="capacity"):
        PageTier(0)


# ---------------------------------------------------------------------------------------------- write policies


def _tiered(policy: str, device_blocks: int = 4, host: int = 8) -> tuple[TieredCache, dict, dict]:
    device_mem: dict[int, object] = {}
    host_mem: dict[int, object] = {}

    def copy(blocks: list[int], slots: list[int]) -> None:
        for b, s in zip(blocks, slots, strict=True):
            host_mem[s] = device_mem[b]

    tiered = TieredCache(
        RadixCache(device_blocks, 2), host=PageTier(host), write_policy=policy, copy_to_host=copy, fingerprint="t"
    )
    return tiered, device_mem, host_mem


def _serve(tiered: TieredCache, device_mem: dict, tokens: list[int]) -> tuple[int, int]:
    """One request: match, compute what is missing (content = the prefix), insert, adopt. (device, host) pages."""
    device = tiered.device
    p = device.page_size
    match = tiered.match(tokens)
    device.lock(match.device.node)
    new = device.allocate(len(tokens) // p - match.device_pages)
    for i, b in enumerate(new):
        device_mem[b] = tuple(tokens[: (match.device_pages + i + 1) * p])
    blocks = match.device.blocks + new
    cached = device.insert(tokens, blocks) // p
    hashes = tiered.chain(None).upto(tokens, len(tokens) // p)
    tiered.adopted(hashes[cached:], blocks[cached:], tokens[cached * p :])
    device.unlock(match.device.node)
    return match.device_pages, match.host_pages


def test_write_through_copies_every_adopted_page_at_once() -> None:
    tiered, device_mem, host_mem = _tiered("write_through")
    _serve(tiered, device_mem, [1, 2, 3, 4])
    assert len(tiered.host) == 2
    assert sorted(host_mem.values()) == [(1, 2), (1, 2, 3, 4)]


def test_write_back_copies_a_page_only_when_the_device_evicts_it() -> None:
    tiered, device_mem, host_mem = _tiered("write_back")
    _serve(tiered, device_mem, [1, 2, 3, 4])
    assert len(tiered.host) == 0
    tiered.device.evict(1)  # the deepest page goes first
    assert list(host_mem.values()) == [(1, 2, 3, 4)]
    assert _serve(tiered, device_mem, [1, 2, 3, 4]) == (1, 1)  # page 0 on the device, page 1 from the host


def test_write_through_selective_backs_up_after_the_second_hit() -> None:
    tiered, device_mem, host_mem = _tiered("write_through_selective")
    _serve(tiered, device_mem, [1, 2, 3, 4])
    _serve(tiered, device_mem, [1, 2, 3, 4, 5, 6])  # first hit
    assert len(tiered.host) == 0
    _serve(tiered, device_mem, [1, 2, 3, 4, 7, 8])  # second hit on [1..4]
    assert sorted(host_mem.values()) == [(1, 2), (1, 2, 3, 4)]


def test_a_page_evicted_from_the_device_is_served_from_the_host() -> None:
    tiered, device_mem, _ = _tiered("write_through", device_blocks=2)
    _serve(tiered, device_mem, [1, 2, 3, 4])
    _serve(tiered, device_mem, [5, 6, 7, 8])  # evicts [1..4] from the device
    assert _serve(tiered, device_mem, [1, 2, 3, 4]) == (0, 2)


def test_an_adoption_larger_than_the_host_copies_each_slot_once() -> None:
    copies: list[tuple[list[int], list[int]]] = []
    tiered = TieredCache(
        RadixCache(16, 2), host=PageTier(2), copy_to_host=lambda b, s: copies.append((b, s)), fingerprint="t"
    )
    tokens = list(range(10))
    blocks = tiered.device.allocate(5)
    tiered.device.insert(tokens, blocks)
    hashes = tiered.chain(None).upto(tokens, 5)
    tiered.adopted(hashes, blocks, tokens)
    # The last three pages' slots were taken again within the batch (stored tail first, the head kept): copying them
    # too wrote two pages into one slot in a single index_copy_ (undefined order, PyTorch says) and counted pages the
    # host never kept. The host keeps the run's head: a tail without it is never found (it kept the tail once).
    [(copied, slots)] = copies
    assert copied == list(blocks[:2]) and sorted(slots) == [0, 1]
    assert tiered.host.slots(hashes[:2]) == slots and tiered.host.count_prefix(hashes) == 2
    tiered.check_invariants()


def test_a_dropped_tiered_cache_is_freed_at_once_and_its_device_tree_goes_on() -> None:
    """The device tree's eviction listener holds its TieredCache weakly: held both ways, the two were a cycle that
    only the cyclic collector freed (an engine's tree and tier index outlived it)."""
    tiered, device_mem, host_mem = _tiered("write_back")
    _serve(tiered, device_mem, [1, 2, 3, 4])
    device, ref = tiered.device, weakref.ref(tiered)
    gc.disable()
    try:
        del tiered
        assert ref() is None
    finally:
        gc.enable()
    device.evict(2)  # its listener is gone: the eviction completes and copies nothing
    assert host_mem == {} and device.cached_tokens == 0
    device.check_invariants()


def test_tiered_cache_rejects_an_unknown_write_policy() -> None:
    with pytest.raises(RadixCacheError, match="write_policy"):
        TieredCache(RadixCache(4, 1), host=PageTier(2), write_policy="sometimes")


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"host": 64}, "host must be a PageTier"), ({"lower": 8}, "lower must be a tier"), ({"device": None}, "device")],
)
def test_tiered_cache_rejects_what_is_no_tier_when_made(kwargs: dict, named: str) -> None:
    """TieredCache(cache, host=64) (a size for a tier) was accepted, and the first eviction failed inside allocate
    with AttributeError ("'int' object has no attribute 'name'")."""
    device = RadixCache(4, 1)
    with pytest.raises(RadixCacheError, match=named):
        TieredCache(**{"device": device, **kwargs})
    assert device.on_evict is None  # nothing installed
    device.insert([1, 2, 3, 4], device.allocate(4))
    assert len(device.allocate(4)) == 4  # evicts, with no listener


# ---------------------------------------------------------------------------------------------- state machine

PAGE = 2
tokens_st = st.lists(st.integers(0, 2), min_size=1, max_size=9)
namespace_st = st.sampled_from([None, "tenant"])


class TieredMachine(RuleBasedStateMachine):
    """Requests of a few tokens from a 3-letter alphabet (so prefixes repeat), evictions, three tiers. A page's
    content is (namespace, its whole prefix); every copy between tiers carries content, never a label."""

    @initialize(policy=st.sampled_from(WRITE_POLICIES), device=st.integers(3, 8), host=st.integers(1, 6))
    def build(self, policy: str, device: int, host: int) -> None:
        self.device_mem: dict[int, tuple] = {}
        self.host_mem: dict[int, tuple] = {}
        self.lower_mem: dict[int, tuple] = {}
        self.expected: dict[bytes, tuple] = {}  # page hash -> the content it names
        self.lower = PageTier(10, name="disk")
        self.tiered = TieredCache(
            RadixCache(device, PAGE),
            host=PageTier(host),
            lower=self.lower,
            write_policy=policy,
            fingerprint="machine",
            copy_to_host=self._copy_to_host,
            write_lower=self._write_lower,
        )

    def _copy_to_host(self, blocks: list[int], slots: list[int]) -> None:
        for b, s in zip(blocks, slots, strict=True):
            self.host_mem[s] = self.device_mem[b]

    def _write_lower(self, hashes: list[bytes], blocks: list[int], tokens: object) -> None:
        for h, b in zip(hashes, blocks, strict=True):
            placed = self.lower.store(h)
            if placed is not None and placed[1]:
                self.lower_mem[placed[0]] = self.device_mem[b]

    @rule(tokens=tokens_st, namespace=namespace_st)
    def request(self, tokens: list[int], namespace: str | None) -> None:
        tiered, device = self.tiered, self.tiered.device
        content = [(namespace, tuple(tokens[: (i + 1) * PAGE])) for i in range(-(-len(tokens) // PAGE))]
        chain = tiered.chain(namespace)
        full = len(tokens) // PAGE
        for h, c in zip(chain.upto(tokens, full), content, strict=False):
            assert self.expected.setdefault(h, c) == c, "two prefixes share a page hash"
        match = tiered.match(tokens, namespace, chain)
        d, h, lo = match.device_pages, match.host_pages, match.lower_pages
        assert d + h + lo <= full
        device.lock(match.device.node)
        for i, b in enumerate(match.device.blocks):
            assert self.device_mem[b] == content[i], "the device served another prefix's page"
        host_hashes = match.hashes[d : d + h]
        tiered.host.lock(host_hashes)
        need = len(content) - d
        if need > device.free_blocks + device.evictable_blocks:
            tiered.host.unlock(host_hashes)
            device.unlock(match.device.node)
            return
        new = device.allocate(need)
        for j, slot in enumerate(tiered.host.slots(host_hashes)):
            assert self.host_mem[slot] == content[d + j], "the host served another prefix's page"
            self.device_mem[new[j]] = self.host_mem[slot]
        tiered.host.unlock(host_hashes)
        for j, slot in enumerate(self.lower.slots(match.hashes[d + h : d + h + lo])):
            assert self.lower_mem[slot] == content[d + h + j], "the lower tier served another prefix's page"
            self.device_mem[new[h + j]] = self.lower_mem[slot]
        for k in range(h + lo, need):
            self.device_mem[new[k]] = content[d + k]
        blocks = match.device.blocks + new
        cached = device.insert(tokens, blocks, namespace=namespace) // PAGE
        hashes = chain.upto(tokens, full)
        tiered.adopted(hashes[cached:], blocks[cached:full], tokens[cached * PAGE : full * PAGE])
        if len(tokens) % PAGE:
            device.free(blocks[-1:])
        device.unlock(match.device.node)

    @rule(n=st.integers(1, 4))
    def evict(self, n: int) -> None:
        self.tiered.device.evict(n)

    @invariant()
    def tiers_conserve_and_hold_the_right_pages(self) -> None:
        if not hasattr(self, "tiered"):
            return
        self.tiered.check_invariants()
        self.lower.check_invariants()
        host = self.tiered.host
        for page_hash in list(host._slot):
            assert self.host_mem[host.slots([page_hash])[0]] == self.expected[page_hash]
        for page_hash in list(self.lower._slot):
            assert self.lower_mem[self.lower.slots([page_hash])[0]] == self.expected[page_hash]
        assert host.locked_count == 0  # every request released its host locks


TestTieredMachine = TieredMachine.TestCase


def test_page_tier_locks_count_repeats_and_unlock_undoes_them() -> None:
    tier = PageTier(2)
    tier.store(b"a")
    tier.lock([b"a", b"a"])
    tier.unlock([b"a"])
    assert tier.locked_count == 1
    tier.unlock([b"a"])
    assert tier.locked_count == 0 and tier.evictable_count == 1
    tier.check_invariants()


def test_page_hasher_node_hashes_follow_the_node_through_splits_and_trims() -> None:
    from radixcache.page_hash import PageHasher

    cache = RadixCache(16, 2)
    hasher = PageHasher("fp", 2)
    tokens = [1, 2, 3, 4, 5, 6]
    cache.insert(tokens, cache.allocate(3))
    (node,) = cache.iter_nodes()
    assert hasher.node_hashes(node) == page_hashes(tokens, 2, "fp") == hasher.hashes(tokens)
    assert hasher.node_hashes(node) is hasher.node_hashes(node)  # asked twice (two listeners): hashed once
    cache.match_prefix([1, 2, 9, 9])  # splits: the node keeps its tail, whose pages are the last two
    assert hasher.node_hashes(node) == page_hashes(tokens, 2, "fp")[1:]
    cache.evict(1)  # trims the deepest page off the leaf
    assert hasher.node_hashes(node) == page_hashes(tokens, 2, "fp")[1:2]
