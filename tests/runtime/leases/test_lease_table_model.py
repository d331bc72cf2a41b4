"""The lease table (radixcache.runtime.kv.leases.LeaseTable) against a naive model, on a bare RadixCache: random
grants, hits, clock moves, expiries, give-ways and evictions (hypothesis). After every operation the tree's
invariants hold, the leases are exactly the model's (by path, deadline and age), the pages they lock are the
union of their paths, within the budget, and no leased page was evicted."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache import RadixCache
from radixcache.runtime.kv.leases import LeaseTable

P = 2
SEQS = [
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
    [1, 2, 3, 4, 11, 12, 13, 14],
    [1, 2, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24],
    [30, 31, 32, 33],
]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class Model:
    """Leases as `{path tuple: (deadline, seconds)}` in age order (a dict: oldest first)."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.leases: dict[tuple, tuple[float, float]] = {}

    def pages(self, leases: dict) -> int:
        return len({key[:i] for key in leases for i in range(P, len(key) + 1, P)})

    def expire(self, now: float) -> None:
        self.leases = {k: v for k, v in self.leases.items() if v[0] > now}

    def grant(self, tokens: list[int], seconds: float, now: float) -> int:
        n = min(len(tokens) // P, self.max_blocks) * P
        if seconds <= 0 or n <= 0:
            return 0
        self.expire(now)
        key = tuple(tokens[:n])
        deadline = now + seconds
        old = self.leases.pop(key, None)
        if old is not None:
            deadline = max(deadline, old[0])
        self.leases[key] = (deadline, seconds)
        for k in [k for k in self.leases if len(k) < n and key[: len(k)] == k and self.leases[k][0] <= deadline]:
            del self.leases[k]
        while self.pages(self.leases) > self.max_blocks and next(iter(self.leases)) != key:
            del self.leases[next(iter(self.leases))]
        return n

    def renew(self, matched: tuple, now: float) -> None:
        hit = sorted((k for k in self.leases if matched[: len(k)] == k), key=len, reverse=True)
        for k in hit:  # deepest first, so the shallowest ends youngest (the table walks up from the match)
            deadline, seconds = self.leases.pop(k)
            self.leases[k] = (now + seconds if deadline > now else deadline, seconds)

    def give_way(self) -> None:
        if self.leases:
            del self.leases[next(iter(self.leases))]


GRANT = st.tuples(st.just("grant"), st.integers(0, 3), st.integers(1, 12), st.sampled_from([0.0, 1.0, 2.5, 5.0]))
OPS = st.lists(
    st.one_of(
        GRANT,
        GRANT,
        GRANT,
        st.tuples(st.just("hit"), st.integers(0, 3), st.integers(1, 12)),
        st.tuples(st.just("tick"), st.sampled_from([0.5, 1.0, 2.0, 3.0])),
        st.tuples(st.just("expire")),
        st.tuples(st.just("give_way")),
        st.tuples(st.just("evict"), st.integers(1, 6)),
    ),
    min_size=8,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, max_blocks=st.sampled_from([0, 1, 2, 3, 4, 6, 12]))
def test_the_lease_table_follows_the_naive_model(ops: list, max_blocks: int) -> None:
    clock = Clock()
    cache = RadixCache(40, P)
    for seq in SEQS:
        cache.insert(seq, cache.allocate(len(seq) // P))
    table, model = LeaseTable(cache, max_blocks, clock), Model(max_blocks)
    for op in ops:
        kind = op[0]
        if kind == "grant":
            tokens = SEQS[op[1]][: op[2]]
            if cache.peek(tokens).length < len(tokens) // P * P:
                continue  # evicted meanwhile: a finished request's pages are always in the tree when it leases
            got = table.grant(tokens, None, op[3])
            assert got.tokens == model.grant(tokens, op[3], clock.now)
        elif kind == "hit":
            match = cache.match_prefix(SEQS[op[1]][: op[2]])
            table.renew(match.node)
            model.renew(tuple(match.node.tokens()) if match.length else (), clock.now)
        elif kind == "tick":
            clock.now += op[1]
        elif kind == "expire":
            table.expire()
            model.expire(clock.now)
        elif kind == "give_way":
            table.give_way()
            model.give_way()
        else:
            cache.evict(op[1])
        cache.check_invariants()
        keys = [(tuple(lease.node.tokens()), lease.deadline) for lease in table._leases.values()]
        assert keys == [(k, v[0]) for k, v in model.leases.items()]
        assert table.blocks == model.pages(model.leases) == cache.locked_blocks <= max(max_blocks, 0)
        for key, _ in keys:
            assert cache.peek(array("q", key)).length == len(key)  # a leased page is never evicted
    clock.now += 100
    table.expire()
    assert len(table) == 0 and cache.locked_blocks == 0
    cache.check_invariants()
