"""Each fixed-order policy against a brute-force reference over single pages, on random request sequences.

The reference knows nothing of nodes: it keeps every cached page (a page-aligned prefix) with the time it was last
read or written, its hits and when it was inserted, and evicts one page at a time: among the unlocked pages with
no cached page below them, the one with the smallest key (LRU: last access; LFU: hits, then last access; FIFO:
insertion, then last access; SLRU: protected or not, then last access). A request matches its prompt, locks the
match, allocates the rest, and (maybe after others) inserts everything and unlocks, as the simulator and the engine
drive the tree. After every step the tree must hold exactly the reference's pages, each with the reference's last
access, hits and insertion time (what the policies rank by; a node's pages share them, so a split must leave them).
"""

from __future__ import annotations

from collections.abc import Callable

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from radixcache import RadixCache

Path = tuple[int, ...]


class PageReference:
    """The cache as a dict of pages, evicted one page at a time by the policy's key."""

    def __init__(self, page_size: int, key: Callable[[dict], tuple]) -> None:
        self.p, self.key = page_size, key
        self.pages: dict[Path, dict] = {}  # path -> {"last", "hits", "created", "locks"}
        self.clock = 0

    def cached_pages(self, tokens: list[int]) -> int:
        n = 0
        while (n + 1) * self.p <= len(tokens) and tuple(tokens[: (n + 1) * self.p]) in self.pages:
            n += 1
        return n

    def match(self, tokens: list[int]) -> int:
        self.clock += 1
        n = self.cached_pages(tokens)
        for i in range(1, n + 1):
            page = self.pages[tuple(tokens[: i * self.p])]
            page["last"] = self.clock
            page["hits"] += 1
        return n

    def insert(self, tokens: list[int]) -> None:
        self.clock += 1
        for i in range(1, len(tokens) // self.p + 1):
            page = self.pages.setdefault(tuple(tokens[: i * self.p]), {"hits": 0, "created": self.clock, "locks": 0})
            page["last"] = self.clock  # read or written: only the pages of these tokens

    def lock(self, tokens: list[int], pages: int, delta: int) -> None:
        for i in range(1, pages + 1):
            self.pages[tuple(tokens[: i * self.p])]["locks"] += delta

    def evict(self, n: int) -> None:
        for _ in range(n):
            parents = {path[: -self.p] for path in self.pages}
            leaves = [path for path, page in self.pages.items() if path not in parents and not page["locks"]]
            if not leaves:
                return
            keys = sorted((self.key(self.pages[path]), path) for path in leaves)
            assert len(keys) == 1 or keys[0][0] != keys[1][0], "a tie: the order is not the reference's to decide"
            del self.pages[keys[0][1]]


KEYS: dict[str, Callable[[dict], tuple]] = {
    "lru": lambda page: (page["last"],),
    "lfu": lambda page: (page["hits"], page["last"]),
    "fifo": lambda page: (page["created"], page["last"]),
    "slru": lambda page: (page["hits"] >= 2, page["last"]),
    # the lease policies without a hint: exactly LRU (docs/eviction.md)
    "tlru": lambda page: (page["last"],),
    "agent": lambda page: (page["last"],),
}


def tree_pages(cache: RadixCache) -> dict[Path, tuple[int, int, int]]:
    """Each cached page, with the last access, hits and insertion time of the node that holds it (what the
    policies rank by: a split must leave each page what the reference says)."""
    p, pages = cache.page_size, {}
    for node in cache.iter_nodes():
        path = tuple(node.tokens())
        start = len(path) - len(node.key)
        for i in range(len(node.blocks)):
            pages[path[: start + (i + 1) * p]] = (node.last_access, node.hit_count, node.created)
    return pages


def reference_pages(ref: PageReference) -> dict[Path, tuple[int, int, int]]:
    return {path: (page["last"], page["hits"], page["created"]) for path, page in ref.pages.items()}


def replay(policy: str, page_size: int, capacity: int, steps: list[tuple]) -> None:
    """Run `steps` through the tree and the reference, comparing the cached pages after each."""
    cache, ref = RadixCache(capacity, page_size=page_size, policy=policy), PageReference(page_size, KEYS[policy])
    p, running, seen = page_size, [], [[]]
    for kind, pick, cut, extra, finish in steps:
        if kind == "evict":
            cache.evict(pick)
            ref.evict(pick)
        else:
            bases = seen + [tokens for _, tokens, _, _ in running]  # a running request's prefix: a parallel branch
            base = bases[pick % len(bases)]
            tokens = base[: cut % (len(base) + 1)] + extra
            match = cache.match_prefix(tokens)
            cached = ref.match(tokens)
            assert len(match.blocks) == cached
            cache.lock(match.node)
            ref.lock(tokens, cached, 1)
            need = -(-len(tokens) // p) - cached
            if need > cache.free_blocks + cache.evictable_blocks:
                cache.unlock(match.node)
                ref.lock(tokens, cached, -1)
            else:
                short = need - cache.free_blocks
                running.append((match, tokens, cache.allocate(need), cached))
                ref.evict(max(0, short))
            while len(running) > finish:  # finish the oldest requests, or the one `pick` names
                match, tokens, new, cached = running.pop(pick % len(running))
                blocks = match.blocks + new
                cache.insert(tokens, blocks)
                ref.insert(tokens)
                if len(tokens) % p:
                    cache.free(blocks[-1:])
                cache.unlock(match.node)
                ref.lock(tokens, cached, -1)
                seen.append(tokens)
        cache.check_invariants()
        assert tree_pages(cache) == reference_pages(ref)


def steps(page_size: int) -> st.SearchStrategy[list[tuple]]:
    # often no new tokens: a cut of a sequence seen before, which ends inside a cached leaf
    extra = st.one_of(st.just([]), st.lists(st.integers(0, 2), max_size=3 * page_size + 1))
    request = st.tuples(st.just("request"), st.integers(0, 50), st.integers(0, 20), extra, st.integers(0, 2))
    evict = st.tuples(st.just("evict"), st.integers(0, 3), st.just(0), st.just([]), st.just(0))
    return st.lists(st.one_of(request, request, request, evict), min_size=10, max_size=40)


@pytest.mark.parametrize("policy", sorted(KEYS))
@settings(max_examples=40)
@given(data=st.data())
def test_each_policy_evicts_the_pages_a_brute_force_reference_evicts(policy: str, data: st.DataObject) -> None:
    page_size = data.draw(st.integers(1, 3))
    capacity = data.draw(st.integers(1, 12))
    replay(policy, page_size, capacity, data.draw(steps(page_size)))


@pytest.mark.parametrize("page_size", [1, 2])
def test_inserting_a_prefix_of_a_leaf_refreshes_only_the_prefix(page_size: int) -> None:
    """A request whose tokens end inside a cached leaf (it ran beside the one that cached the longer sequence)
    touched the whole leaf: the pages past its end, which nothing read, were kept over older reads."""
    p = page_size
    cache = RadixCache(16, page_size=p)
    long, other = [1] * 4 * p, [2] * 2 * p
    for tokens in (long, other):
        cache.insert(tokens, cache.allocate(len(tokens) // p))
    cache.insert(long[: 2 * p], cache.allocate(2))  # the tree holds these pages: nothing new

    cache.evict(2)  # the two pages of `long` past the prefix were read least recently

    assert set(tree_pages(cache)) == {tuple(long[: i * p]) for i in (1, 2)} | {tuple(other[: i * p]) for i in (1, 2)}
