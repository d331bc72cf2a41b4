"""RetentionPolicy's mark index against the linear scan it replaced, on trees built by a real RadixCache."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from radixcache import EvictionPolicy, RadixCache, TreeNode, make_policy
from radixcache.runtime.kv import retention
from radixcache.runtime.kv.retention import MAX_MARKS, RetentionPolicy

NAMESPACES = (None, "tenant")
CAPACITY_BLOCKS = 20
SMALL_LIMIT = 8  # MAX_MARKS in the property tests, so that dropping the oldest mark happens often


class LinearScanRetention(EvictionPolicy):
    """The reference: RetentionPolicy as it was before the index, scanning every mark per priority."""

    def __init__(self, base: str | EvictionPolicy = "lru") -> None:
        self.base = make_policy(base)
        self.name = self.base.name
        self.ranks_by_extent = self.base.ranks_by_extent
        self._marks: dict[tuple[Hashable, tuple], int] = {}

    def mark(self, namespace: Hashable, tokens: Sequence[int], priority: int) -> None:
        key = (namespace, tuple(tokens))
        self._marks.pop(key, None)
        if priority > 0:
            self._marks[key] = priority
            while len(self._marks) > retention.MAX_MARKS:
                del self._marks[next(iter(self._marks))]

    def clear(self) -> int:
        n = len(self._marks)
        self._marks.clear()
        return n

    @property
    def marks(self) -> int:
        return len(self._marks)

    def priority(self, node: TreeNode) -> tuple:
        return (self.retention(node) if self._marks else 0, *self.base.priority(node))

    def on_evict(self, node: TreeNode, priority: tuple) -> None:
        self.base.on_evict(node, priority[1:])

    def retention(self, node: TreeNode) -> int:
        best = 0
        path: list[int] | None = None
        for (namespace, tokens), r in self._marks.items():
            if r <= best or namespace != node.namespace or len(tokens) <= node.prefix_len:
                continue
            if path is None:
                path = node.tokens()
            n = min(len(tokens), len(path))
            if list(tokens[:n]) == path[:n]:
                best = r
        return best


# ---------------------------------------------------------------------------------------------- random ops

sequences = st.lists(st.integers(0, 3), max_size=20)  # a 4-token alphabet: paths share long prefixes
odd_tokens = st.sampled_from([-1, 2**63, 2**70, 1.0, 2.5, True, "x"])  # equal to no tree token, or to an int


@st.composite
def mark_tokens(draw: st.DrawFn, inserted: list[list[int]]) -> list:
    """A prefix of an inserted sequence (cut anywhere, page-aligned or not), maybe extended, or fresh tokens."""
    if inserted and draw(st.booleans()):
        base = draw(st.sampled_from(inserted))
        tokens: list = base[: draw(st.integers(0, len(base)))]
        if draw(st.booleans()):
            tokens += draw(st.lists(st.integers(0, 3), max_size=6))
    else:
        tokens = draw(sequences)
    if tokens and draw(st.integers(0, 9)) == 0:  # now and then a token no tree node can hold (or 1.0 for 1)
        tokens[draw(st.integers(0, len(tokens) - 1))] = draw(odd_tokens)
    return tokens


def insert(cache: RadixCache, tokens: list[int], namespace: Hashable) -> tuple:
    """What a request does: match, lock, allocate the rest, insert, free the unaligned tail page, unlock."""
    p = cache.page_size
    match = cache.match_prefix(tokens, namespace=namespace)
    cache.lock(match.node)
    new = cache.allocate(-(-len(tokens) // p) - len(match.blocks))
    cached = cache.insert(tokens, match.blocks + new, namespace=namespace)
    if len(tokens) % p:
        cache.free(new[-1:])
    cache.unlock(match.node)
    return match.length, cached


def run_op(data: st.DataObject, caches: list[RadixCache], policies: list, inserted: list[list[int]]) -> None:
    """Draw one operation and apply it to every (cache, policy) pair alike; each must answer the same."""
    kind = data.draw(st.sampled_from(["insert", "insert", "match", "mark", "mark", "evict", "clear"]))
    namespace = data.draw(st.sampled_from(NAMESPACES))
    if kind in ("insert", "match"):
        tokens = data.draw(sequences)
        if kind == "insert":
            results = {insert(cache, tokens, namespace) for cache in caches}
            inserted.append(tokens)
        else:
            matches = [cache.match_prefix(tokens, namespace=namespace) for cache in caches]
            results = {(match.length, tuple(match.blocks)) for match in matches}
    elif kind == "mark":
        tokens = data.draw(mark_tokens(inserted))
        priority = data.draw(st.integers(0, 4))  # 0 removes the mark
        for policy in policies:
            policy.mark(namespace, tokens, priority)
        results = {policy.marks for policy in policies}
    elif kind == "evict":
        blocks = data.draw(st.integers(1, 8))
        results = {cache.evict(blocks) for cache in caches}
    else:
        results = {policy.clear() for policy in policies}
    assert len(results) == 1, f"{kind}: the implementations disagree: {results}"


def every_node(cache: RadixCache) -> list[TreeNode]:
    """Every node, namespace roots included (a root's retention is the best mark of its namespace)."""
    return [*cache._roots.values(), *cache.iter_nodes()]


def snapshot(cache: RadixCache) -> list[tuple]:
    nodes = sorted(
        (repr(node.namespace), tuple(node.tokens()), tuple(node.blocks), node.last_access, node.hit_count)
        for node in cache.iter_nodes()
    )
    return [*nodes, (cache.free_blocks, cache.evictable_blocks, cache.stats.evicted_tokens)]


# ---------------------------------------------------------------------------------------------- properties


@given(data=st.data(), page_size=st.sampled_from([1, 2, 4]))
def test_retention_of_every_node_is_the_best_mark_a_linear_scan_finds(data: st.DataObject, page_size: int) -> None:
    policy = RetentionPolicy("lru")
    reference = LinearScanRetention("lru")
    cache = RadixCache(CAPACITY_BLOCKS, page_size=page_size, policy=policy)
    inserted: list[list[int]] = []
    with mock.patch.object(retention, "MAX_MARKS", SMALL_LIMIT):
        for _ in range(data.draw(st.integers(1, 40))):
            run_op(data, [cache], [policy, reference], inserted)
            for node in every_node(cache):
                assert policy.priority(node) == reference.priority(node), (
                    f"{node!r} at {node.tokens()} (prefix_len {node.prefix_len}), marks {reference._marks}"
                )
    cache.check_invariants()


@given(data=st.data(), page_size=st.sampled_from([1, 2, 4]), base=st.sampled_from(["lru", "lfu", "fifo"]))
def test_eviction_under_marks_takes_the_same_leaves_in_the_same_order_as_the_linear_scan(
    data: st.DataObject, page_size: int, base: str
) -> None:
    policies = [RetentionPolicy(base), LinearScanRetention(base)]
    caches = [RadixCache(CAPACITY_BLOCKS, page_size=page_size, policy=policy) for policy in policies]
    inserted: list[list[int]] = []
    with mock.patch.object(retention, "MAX_MARKS", SMALL_LIMIT):
        for _ in range(data.draw(st.integers(1, 40))):
            run_op(data, caches, policies, inserted)
            assert snapshot(caches[0]) == snapshot(caches[1])
    while caches[0].evictable_blocks:  # drain one block at a time: the whole remaining order must agree
        assert caches[0].evict(1) == caches[1].evict(1) == 1
        assert snapshot(caches[0]) == snapshot(caches[1])
    assert caches[1].evictable_blocks == 0
    for cache in caches:
        cache.check_invariants()


# ---------------------------------------------------------------------------------------------- examples


def test_a_mark_ending_inside_a_leaf_and_a_leaf_ending_inside_a_mark_both_apply() -> None:
    policy = RetentionPolicy("lru")
    cache = RadixCache(16, page_size=2, policy=policy)
    insert(cache, [1, 2, 3, 4, 5, 6], None)
    insert(cache, [1, 2, 3, 4, 7, 8, 9, 9], None)  # splits: [1 2 3 4] -> [5 6], [7 8 9 9]
    nodes = {tuple(node.key): node for node in cache.iter_nodes()}
    head, short, long = nodes[(1, 2, 3, 4)], nodes[(5, 6)], nodes[(7, 8, 9, 9)]
    policy.mark(None, [1, 2, 3], 1)  # ends inside `head`: applies to head only
    policy.mark(None, [1, 2, 3, 4, 7, 8, 9, 9, 5, 5], 2)  # `long`'s path is a prefix of it
    policy.mark(None, [1, 2, 3, 4, 5], 3)  # ends inside `short` (not page-aligned)
    policy.mark("tenant", [1, 2, 3, 4, 5, 6], 4)  # another namespace: applies to nothing here
    assert [policy.priority(node)[0] for node in (head, short, long)] == [3, 3, 2]
    policy.mark(None, [1, 2, 3, 4, 5], 0)  # 0 removes
    assert [policy.priority(node)[0] for node in (head, short, long)] == [2, 0, 2]
    assert policy.clear() == 3
    assert [policy.priority(node)[0] for node in (head, short, long)] == [0, 0, 0]


def test_marks_beyond_the_limit_drop_the_oldest_first() -> None:
    policy = RetentionPolicy("lru")
    reference = LinearScanRetention("lru")
    cache = RadixCache(64, page_size=4, policy=policy)
    prompts = [[i // 16, i % 16, *range(100, 106)] for i in range(MAX_MARKS + 40)]
    for prompt in prompts[:40]:
        insert(cache, prompt, None)
    for i, prompt in enumerate(prompts):
        for p in (policy, reference):
            p.mark(None, prompt, 1 + i % 5)
    for p in (policy, reference):
        p.mark(None, prompts[-1], 9)  # re-marking moves a mark to the newest end
    assert policy.marks == reference.marks == MAX_MARKS
    leaves = [node for node in cache.iter_nodes() if node.is_leaf]
    assert [policy.priority(leaf) for leaf in leaves] == [reference.priority(leaf) for leaf in leaves]
    assert all(policy.priority(leaf)[0] == 0 for leaf in leaves)  # their marks were the 40 oldest
    policy.mark(None, prompts[39], 7)  # the newest insert: still cached
    assert {policy.priority(leaf)[0] for leaf in leaves} == {0, 7}


def test_the_index_stays_compressed_as_marks_are_dropped_or_removed() -> None:
    policy = RetentionPolicy("lru")
    rng = random.Random(0)
    prompts = [[rng.randrange(3) for _ in range(rng.randrange(1, 30))] for _ in range(20 * MAX_MARKS)]
    for prompt in prompts:  # churns through the limit many times over
        policy.mark(None, prompt, 1 + rng.randrange(3))

    def trie_nodes() -> list:
        stack, nodes = list(policy._tries.values()), []
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        return nodes

    assert policy.marks == MAX_MARKS
    nodes = trie_nodes()
    # Every node but the root holds a mark or branches, so a mark adds at most a leaf and a branch point.
    assert all(node.parent is None or node.exact or node.cut or len(node.children) > 1 for node in nodes)
    assert len(nodes) <= 2 * MAX_MARKS + 1
    for prompt in prompts[::-1]:
        policy.mark(None, prompt, 0)
    assert policy.marks == 0
    assert trie_nodes() == []


@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([None, 0.001, 60.0, 3600.0])), min_size=1, max_size=12))
def test_a_lease_hinted_base_gets_its_hints_through_the_wrapper(steps: list[tuple[int, float | None]]) -> None:
    """The engine wraps its policy in RetentionPolicy: a tlru or agent base told hints through it (expect_reuse_in)
    stamps and evicts as the bare policy does. The wrapper neither forwarded the hints nor showed the cache the
    base's hint_us, so every node was stamped None and a wrapped agent ranked every page as hint-less."""
    for name in ("tlru", "agent"):
        bare, wrapped = make_policy(name), RetentionPolicy(name)
        caches = [RadixCache(CAPACITY_BLOCKS, page_size=2, policy=policy) for policy in (bare, wrapped)]
        for prompt, hint in steps:
            for cache in caches:
                cache.policy.expect_reuse_in(hint)
                insert(cache, [prompt, prompt + 1, 7, prompt, 9], None)
        hints = [sorted((tuple(n.tokens()), n.hint) for n in cache.iter_nodes()) for cache in caches]
        assert hints[0] == hints[1]
        while True:
            freed = [cache.evict(1) for cache in caches]
            assert freed[0] == freed[1] and snapshot(caches[0]) == snapshot(caches[1])
            if not freed[0]:
                break
