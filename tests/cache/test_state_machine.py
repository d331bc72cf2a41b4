"""Random match/peek/insert/lock/lock_prefix/unlock/allocate/free/evict sequences checked against a naive reference
model.

The reference is a plain dict of cached prefixes, `(namespace, page-aligned tokens) -> block id of the last page`,
plus sets of free and held block ids and a list of the locks taken. It never asks the cache what to expect. The
one thing it cannot know is which pages a policy chooses to evict: after `evict` and `allocate` it reads the cache's
pages back and accepts the change only if the cache lost exactly the expected number of unlocked pages, deepest
first (what remains is still closed under prefixes), and changed no block of any page it kept.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Hashable
from typing import Any

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixcache import (
    BlockCountError,
    BlockStateError,
    CacheFullError,
    InvalidTokensError,
    LockError,
    RadixCache,
    RadixCacheError,
)
from radixcache.node import TreeNode
from radixcache.policy.registry import ALL_POLICIES

Key = tuple[Hashable, tuple[int, ...]]


def is_block_array(blocks: object) -> bool:
    return type(blocks) is array and blocks.typecode == "q"


NAMESPACES = [None, "tenant"]


@functools.cache  # one strategy per length, built and validated once
def cut_points(length: int) -> st.SearchStrategy[int]:
    """Where to cut a cached prefix of `length` tokens: its end, or any token."""
    return st.one_of(st.just(length), st.integers(0, length))


def page_map(cache: RadixCache) -> dict[Key, int]:
    """The cache's pages as the reference stores them, read through the public node API."""
    p = cache.page_size
    pages: dict[Key, int] = {}
    for node in cache.iter_nodes():
        path = tuple(node.tokens())
        start = len(path) - len(node.key)
        for i, block in enumerate(node.blocks):
            pages[(node.namespace, path[: start + (i + 1) * p])] = block
    return pages


def page_meta(cache: RadixCache) -> dict[Key, tuple[int, int]]:
    """Per cached page: the last access and hit count of the node that holds it (a split keeps both)."""
    p = cache.page_size
    meta: dict[Key, tuple[int, int]] = {}
    for node in cache.iter_nodes():
        path = tuple(node.tokens())
        start = len(path) - len(node.key)
        for i in range(len(node.blocks)):
            meta[(node.namespace, path[: start + (i + 1) * p])] = (node.last_access, node.hit_count)
    return meta


def observe(cache: RadixCache) -> tuple[Any, ...]:
    """What an erroring call must leave untouched."""
    nodes = sorted((n.uid, n.lock_ref, n.hit_count, n.last_access, tuple(n.blocks)) for n in cache.iter_nodes())
    return (
        cache.free_blocks,
        cache.evictable_blocks,
        cache.locked_blocks,
        cache.held_blocks,
        cache.stats,
        page_map(cache),
        nodes,
        cache.namespaces(),
    )


class CacheModel(RuleBasedStateMachine):
    """Subclasses set the page size, the page patterns tokens are built from, and the capacity."""

    PAGE_SIZE = 1
    PATTERNS: tuple[tuple[int, ...], ...] = ((0,), (1,), (2,), (3,))
    TAIL_ALPHABET = 4
    MAX_PAGES = 5
    CAPACITY = 16

    # counts for allocate and evict: mostly a few blocks, so the tree grows deep before it is cut back
    SMALL_MOSTLY = st.one_of(st.integers(0, 3), st.integers(0, CAPACITY + 1))

    def __init__(self) -> None:
        super().__init__()
        self.cache = RadixCache(self.CAPACITY, page_size=self.PAGE_SIZE)
        self.pages: dict[Key, int] = {}
        self.free: set[int] = set(range(self.CAPACITY))
        self.held: set[int] = set()
        self.held_order: list[int] = []  # every block allocate handed out, in order (pruned lazily)
        self.locks: list[tuple[TreeNode, Hashable, tuple[int, ...]]] = []
        self.handles: list[TreeNode] = []  # nodes from earlier matches, possibly evicted or trimmed since
        self.counts = {"queries": 0, "query_tokens": 0, "hit_tokens": 0, "inserted_tokens": 0, "evicted_blocks": 0}

    # ------------------------------------------------------------------ strategies

    @classmethod
    @functools.cache  # one strategy per (class, max_pages): hypothesis validates a new strategy at its first draw
    def token_lists(cls, max_pages: int) -> st.SearchStrategy[list[int]]:
        pages = st.lists(st.sampled_from(cls.PATTERNS), max_size=max_pages)
        tail = st.lists(st.integers(0, cls.TAIL_ALPHABET - 1), max_size=cls.PAGE_SIZE - 1)
        return st.builds(lambda ps, t: [tok for page in ps for tok in page] + t, pages, tail)

    def draw_tokens(self, data: st.DataObject, namespace: Hashable) -> list[int]:
        """Mostly a cached prefix cut at any token and extended a little (to force splits and deep nodes),
        else fresh tokens."""
        known = sorted(t for ns, t in self.pages if ns == namespace)
        if known and data.draw(st.integers(0, 3)):
            base = data.draw(st.sampled_from(known))
            cut = data.draw(cut_points(len(base)))
            tokens = [*base[:cut], *data.draw(self.token_lists(2))]
        else:
            tokens = data.draw(self.token_lists(self.MAX_PAGES))
        return tokens[: (self.MAX_PAGES + 1) * self.PAGE_SIZE]

    # ------------------------------------------------------------------ the reference model

    def ref_match(self, namespace: Hashable, tokens: list[int]) -> tuple[int, list[int]]:
        p = self.PAGE_SIZE
        blocks: list[int] = []
        while (len(blocks) + 1) * p <= len(tokens):
            block = self.pages.get((namespace, tuple(tokens[: (len(blocks) + 1) * p])))
            if block is None:
                break
            blocks.append(block)
        return len(blocks) * p, blocks

    def locked_pages(self) -> set[Key]:
        p = self.PAGE_SIZE
        return {(ns, prefix[: j * p]) for _, ns, prefix in self.locks for j in range(1, len(prefix) // p + 1)}

    def evictable_count(self) -> int:
        return len(self.pages) - len(self.locked_pages())

    def absorb_eviction(self, expected: int) -> set[int]:
        """Learn which pages the cache evicted, check that the choice was legal, and return their blocks."""
        now = page_map(self.cache)
        assert set(now) <= set(self.pages), "eviction added pages"
        assert all(self.pages[key] == block for key, block in now.items()), "eviction moved a block"
        removed = set(self.pages) - set(now)
        assert len(removed) == expected, f"evicted {len(removed)} pages, expected {expected}"
        assert not removed & self.locked_pages(), "a locked page was evicted"
        p = self.PAGE_SIZE
        assert all(len(t) == p or (ns, t[:-p]) in now for ns, t in now), "eviction left a page without its parent"
        self.counts["evicted_blocks"] += len(removed)
        return {self.pages.pop(key) for key in removed}

    def check_refused(self, error: type[RadixCacheError], call: Any, *args: Any, **kwargs: Any) -> None:
        before = observe(self.cache)
        try:
            call(*args, **kwargs)
        except error:
            pass
        else:
            raise AssertionError(f"{call.__name__}{args} did not raise {error.__name__}")
        assert observe(self.cache) == before, f"{call.__name__} raised but changed the cache"

    # ------------------------------------------------------------------ rules

    @initialize(policy=st.sampled_from(sorted(ALL_POLICIES)))  # the learned `reuse` too
    def choose_policy(self, policy: str) -> None:
        self.cache = RadixCache(self.CAPACITY, page_size=self.PAGE_SIZE, policy=policy)

    def checked_match(self, tokens: list[int], namespace: Hashable) -> TreeNode:
        expected_length, expected_blocks = self.ref_match(namespace, tokens)
        m = self.cache.match_prefix(tokens, namespace=namespace)
        self.counts["queries"] += 1
        self.counts["query_tokens"] += len(tokens)
        self.counts["hit_tokens"] += expected_length
        assert m.length == expected_length, f"matched {m.length} tokens, the reference has {expected_length}"
        assert is_block_array(m.blocks), f"match returned {type(m.blocks).__name__}, not an int64 array"
        assert m.blocks.tolist() == expected_blocks, f"match returned {m.blocks}, the reference has {expected_blocks}"
        return m.node

    @rule(data=st.data(), namespace=st.sampled_from(NAMESPACES))
    def match(self, data: st.DataObject, namespace: Hashable) -> None:
        tokens = self.draw_tokens(data, namespace)
        node = self.checked_match(tokens, namespace)
        if node.parent is not None:  # not the namespace root: remember it for the stale-unlock rule
            self.handles = [*self.handles[-7:], node]

    @rule(data=st.data(), namespace=st.sampled_from(NAMESPACES))
    def lock(self, data: st.DataObject, namespace: Hashable) -> None:
        tokens = self.draw_tokens(data, namespace)
        length, _ = self.ref_match(namespace, tokens)
        node = self.checked_match(tokens, namespace)
        self.cache.lock(node)
        if length:
            self.locks.append((node, namespace, tuple(tokens[:length])))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        node, _, _ = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.cache.unlock(node)

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def unlock_a_node_not_locked(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(self.handles))
        if any(locked is node for locked, _, _ in self.locks):
            return
        self.check_refused(LockError, self.cache.unlock, node)

    @rule(data=st.data(), namespace=st.sampled_from([*NAMESPACES, "unseen"]))
    def peek(self, data: st.DataObject, namespace: Hashable) -> None:
        tokens = self.draw_tokens(data, namespace)
        expected_length, expected_blocks = self.ref_match(namespace, tokens)
        before, clock = observe(self.cache), self.cache._clock  # observe holds the stats and every node

        result = self.cache.peek(tokens, namespace=namespace)

        assert result.length == expected_length, f"peeked {result.length} tokens, the reference has {expected_length}"
        assert is_block_array(result.blocks), f"peek returned {type(result.blocks).__name__}, not an int64 array"
        assert result.blocks.tolist() == expected_blocks, (
            f"peek returned blocks {result.blocks}, the reference has {expected_blocks}"
        )
        node = result.node
        if expected_length == 0:
            assert node.parent is None, "a peek that matched nothing returned a non-root node"
        else:  # the deepest node reached, possibly matched only in part
            assert node.prefix_len < expected_length <= node.end_len, f"{node!r} does not hold the match's end"
            assert node.tokens()[:expected_length] == tokens[:expected_length]
        assert observe(self.cache) == before, "peek changed the cache (stats, nodes or namespaces)"
        assert self.cache._clock == clock, "peek ticked the clock"

    @rule(data=st.data(), namespace=st.sampled_from(NAMESPACES))
    def lock_prefix(self, data: st.DataObject, namespace: Hashable) -> None:
        p = self.PAGE_SIZE
        tokens = self.draw_tokens(data, namespace)
        if len(tokens) < p:
            return
        cached, _ = self.ref_match(namespace, tokens)
        if cached and data.draw(st.booleans()):  # mostly within the cached prefix, so the pin takes
            n = data.draw(st.integers(1, cached // p)) * p
        else:
            n = data.draw(st.integers(1, len(tokens) // p)) * p
        before, meta, clock = observe(self.cache), page_meta(self.cache), self.cache._clock

        node = self.cache.lock_prefix(tokens, n, namespace=namespace)

        assert self.cache._clock == clock, "lock_prefix ticked the clock"
        if n > cached:
            assert node is None, f"lock_prefix({n}) locked a prefix of which only {cached} tokens are cached"
            assert observe(self.cache) == before, "a lock_prefix that took nothing changed the cache"
            return
        assert node is not None, f"lock_prefix({n}) took nothing, but {cached} tokens are cached"
        assert node.end_len == n and node.tokens() == tokens[:n], f"{node!r} does not end at {n}"
        assert page_meta(self.cache) == meta, "lock_prefix refreshed access times or hit counts"
        # the counters invariant checks that exactly the pages of tokens[:n] not locked before are locked now
        self.locks.append((node, namespace, tuple(tokens[:n])))

    @rule(n=SMALL_MOSTLY)
    def allocate(self, n: int) -> None:
        if n > self.CAPACITY or n > len(self.free) + self.evictable_count():
            self.check_refused(CacheFullError, self.cache.allocate, n)
            return
        shortfall = max(0, n - len(self.free))
        got = self.cache.allocate(n)
        assert is_block_array(got), f"allocate returned {type(got).__name__}, not an int64 array"
        got = got.tolist()
        available = self.free | self.absorb_eviction(shortfall)
        assert len(got) == n and len(set(got)) == n, f"allocate({n}) returned {got}"
        assert set(got) <= available, "allocate handed out a block that was not free"
        self.free = available - set(got)
        self.held |= set(got)
        self.held_order = [b for b in self.held_order if b in self.held and b not in got] + got

    @rule(n=SMALL_MOSTLY)
    def evict(self, n: int) -> None:
        expected = min(n, self.evictable_count())
        assert self.cache.evict(n) == expected
        self.free |= self.absorb_eviction(expected)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_held(self, data: st.DataObject) -> None:
        blocks = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, unique=True))
        self.cache.free(blocks)
        self.held -= set(blocks)
        self.free |= set(blocks)

    @rule(data=st.data(), namespace=st.sampled_from(NAMESPACES))
    def insert(self, data: st.DataObject, namespace: Hashable) -> None:
        self.checked_insert(data, namespace, self.draw_tokens(data, namespace))

    @rule(data=st.data(), namespace=st.sampled_from(NAMESPACES))
    def insert_fresh(self, data: st.DataObject, namespace: Hashable) -> None:
        self.checked_insert(data, namespace, data.draw(self.token_lists(self.MAX_PAGES)))

    def checked_insert(self, data: st.DataObject, namespace: Hashable, tokens: list[int]) -> None:
        p = self.PAGE_SIZE
        short = -(-len(tokens) // p) - len(self.held)  # enough held blocks even if every page is new
        if 0 < short <= len(self.free) + self.evictable_count():
            self.allocate(short)  # the checked allocate rule; it may evict, so the reference is read afterwards
        elif short > 0:
            tokens = tokens[: len(self.held) * p]
        full = len(tokens) // p
        pages = -(-len(tokens) // p)
        # the tree's own blocks for cached pages come from a match; any of them may be swapped for a held duplicate
        cached = self.ref_match(namespace, tokens[: full * p])[1]
        self.checked_match(tokens[: full * p], namespace)
        # held blocks in the order allocate gave them (the cheap path the cache may take), or shuffled
        in_order = [b for b in self.held_order if b in self.held]
        spare = iter(in_order if data.draw(st.booleans()) else data.draw(st.permutations(in_order)))
        own = data.draw(st.sampled_from(["all", "none", "some"]))  # tree blocks for the cached pages?
        blocks = [
            cached[i]
            if i < len(cached) and (own == "all" or (own == "some" and data.draw(st.booleans())))
            else next(spare)
            for i in range(pages)
        ]

        # as a list (converted, then proven like an array) or as the block-id array match and allocate give
        given = array("q", blocks) if data.draw(st.booleans()) else blocks
        assert self.cache.insert(tokens, given, namespace=namespace) == len(cached) * p

        for i, block in enumerate(blocks):
            if i < len(cached):
                if block != cached[i]:  # a held duplicate of a cached page: back to the free pool
                    self.held.remove(block)
                    self.free.add(block)
            elif i < full:  # a new full page: now the tree's
                self.held.remove(block)
                self.pages[(namespace, tuple(tokens[: (i + 1) * p]))] = block
                self.counts["inserted_tokens"] += p
            # else: the unaligned tail page stays held

    @rule(data=st.data())
    def misuse(self, data: st.DataObject) -> None:
        """One kind of bad call, chosen at random; each must raise its error and change nothing."""
        p = self.PAGE_SIZE
        page = list(data.draw(st.sampled_from(self.PATTERNS)))
        namespace = data.draw(st.sampled_from(NAMESPACES))
        kinds = ["free", "tree", "twice", "count", "tokens", "foreign", "swap", "full", "pin"]
        kind = data.draw(st.sampled_from(kinds))
        if kind == "free" and self.free:
            block = data.draw(st.sampled_from(sorted(self.free)))
            self.check_refused(BlockStateError, self.cache.free, [block])
            self.check_refused(BlockStateError, self.cache.insert, page, [block], namespace=namespace)
        elif kind == "tree" and self.pages:
            block = data.draw(st.sampled_from(sorted(self.pages.values())))
            self.check_refused(BlockStateError, self.cache.free, [block])
        elif kind == "twice" and self.held:
            block = data.draw(st.sampled_from(sorted(self.held)))
            self.check_refused(BlockStateError, self.cache.free, [block, block])
        elif kind == "count":
            self.check_refused(BlockCountError, self.cache.insert, page, [], namespace=namespace)
            self.check_refused(BlockCountError, self.cache.insert, [], sorted(self.held)[:1] or [0])
        elif kind == "tokens":
            bad = data.draw(st.sampled_from([[0, -1], [0.5], [None], ["1"], [*page, 2**63]]))
            self.check_refused(InvalidTokensError, self.cache.match_prefix, bad)
            self.check_refused(InvalidTokensError, self.cache.insert, bad, [0] * -(-len(bad) // p))
        elif kind == "foreign" and self.pages:
            # a tree block offered for a page it does not hold
            (owner_ns, owner_tokens), block = data.draw(st.sampled_from(sorted(self.pages.items(), key=repr)))
            if (owner_ns, owner_tokens[:p]) != (namespace, tuple(page)):
                self.check_refused(BlockStateError, self.cache.insert, page, [block], namespace=namespace)
        elif kind == "swap" and any(len(t) > p for _, t in self.pages):
            # the tree's own blocks for cached pages, but two of them in each other's place
            ns, path = data.draw(st.sampled_from(sorted((k for k in self.pages if len(k[1]) > p), key=repr)))
            blocks = self.ref_match(ns, list(path))[1]
            i, j = data.draw(st.permutations(range(len(blocks))))[:2]
            blocks[i], blocks[j] = blocks[j], blocks[i]
            self.check_refused(BlockStateError, self.cache.insert, list(path), blocks, namespace=ns)
        elif kind == "full":
            self.check_refused(CacheFullError, self.cache.allocate, self.CAPACITY + 1)
            beyond = len(self.free) + self.evictable_count() + 1
            if beyond <= self.CAPACITY:
                self.check_refused(CacheFullError, self.cache.allocate, beyond)
        elif kind == "pin":
            # a token count that is not a positive multiple of the page size within the tokens, or a bad namespace
            tokens = self.draw_tokens(data, namespace)
            bad_counts = [0, -p, len(tokens) // p * p + p, float(p), str(p), None, True] + ([p // 2] if p > 1 else [])
            bad = data.draw(st.sampled_from(bad_counts))
            self.check_refused(RadixCacheError, self.cache.lock_prefix, tokens, bad, namespace=namespace)
            self.check_refused(RadixCacheError, self.cache.lock_prefix, [*page, *page], p, namespace=["unhashable"])
            self.check_refused(RadixCacheError, self.cache.peek, tokens, namespace=["unhashable"])

    # ------------------------------------------------------------------ checks after every step

    @invariant()
    def structure_is_sound(self) -> None:
        self.cache.check_invariants()

    @invariant()
    def locked_prefixes_stay_cached(self) -> None:
        for node, namespace, prefix in self.locks:
            assert node.parent is not None and node.end_len == len(prefix), f"locked {node!r} was evicted or cut"
            assert self.cache.peek(prefix, namespace=namespace).length == len(prefix), "a locked prefix was evicted"

    @invariant()
    def blocks_are_conserved(self) -> None:
        cache = self.cache
        assert cache.free_blocks + cache.evictable_blocks + cache.locked_blocks == self.CAPACITY
        tree = set(self.pages.values())
        assert len(tree) == len(self.pages), "the reference gave one block to two pages"
        assert not (self.free & self.held) and not (self.free & tree) and not (self.held & tree)
        assert len(self.free) + len(self.held) + len(tree) == self.CAPACITY

    @invariant()
    def counters_match_the_reference(self) -> None:
        cache = self.cache
        locked = len(self.locked_pages())
        assert cache.free_blocks == len(self.free)
        assert cache.held_blocks == len(self.held)
        assert cache.evictable_blocks == len(self.pages) - locked
        assert cache.locked_blocks == locked + len(self.held)

    @invariant()
    def cached_pages_match_the_reference(self) -> None:
        assert page_map(self.cache) == self.pages

    @invariant()
    def eviction_keys_are_current(self) -> None:
        # private read: the evictable leaves must be re-keyed on every access, split and trim (every live
        # entry of the heap is current). Cost-aware keys keep the inflation of the moment they were set
        # (GreedyDual), and a learned policy's keys drift with what it learns (`keys_drift`), so only their order
        # is free.
        policy = self.cache.policy
        if policy.name != "cost" and not policy.keys_drift:
            for priority, _, _, node in self.cache._evictable_entries():
                assert priority == policy.priority(node), f"{node!r} sits in the evictable set under a stale key"

    @invariant()
    def stats_match_the_reference(self) -> None:
        stats = self.cache.stats
        assert {name: getattr(stats, name) for name in self.counts} == self.counts
        assert stats.evicted_tokens == self.counts["evicted_blocks"] * self.PAGE_SIZE


class PagedCacheModel(CacheModel):
    """Pages of 16 tokens; some patterns share their first half or all but one token, so matches stop mid-page."""

    PAGE_SIZE = 16
    PATTERNS = (
        (0,) * 16,
        (0,) * 8 + (1,) * 8,
        (1,) * 8 + (0,) * 8,
        (0,) * 15 + (1,),
    )
    TAIL_ALPHABET = 2
    MAX_PAGES = 4
    CAPACITY = 8


TestCacheAgainstReferencePage1 = CacheModel.TestCase
TestCacheAgainstReferencePage1.settings = settings(stateful_step_count=60)
TestCacheAgainstReferencePage16 = PagedCacheModel.TestCase
TestCacheAgainstReferencePage16.settings = settings(stateful_step_count=60)
