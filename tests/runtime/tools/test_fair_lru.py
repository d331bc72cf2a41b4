"""The fair LRU (runtime/tools/fair_lru.py), shared by the tool-call memory and the legacy function-call ids,
against a naive reference: every entry stamped with the time it was last used, the scopes with the time they began
holding entries, the victim found by scanning all of them."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime.tools.fair_lru import FairLRU


@dataclass
class Naive:
    max_entries: int
    max_weight: int | None
    entries: dict[tuple[int, int], list[Any]] = field(default_factory=dict)  # (scope, key) -> [value, weight, used]
    since: dict[int, int] = field(default_factory=dict)  # scope -> when it began holding entries
    clock: itertools.count = field(default_factory=itertools.count)

    def held(self, scope: int, by_weight: bool) -> int:
        mine = [e for (s, _), e in self.entries.items() if s == scope]
        return sum(e[1] for e in mine) if by_weight else len(mine)

    def get(self, scope: int, key: int, touch: bool) -> Any:
        entry = self.entries.get((scope, key))
        if entry is not None and touch:
            entry[2] = next(self.clock)
        return None if entry is None else entry[0]

    def pop(self, scope: int, key: int) -> Any:
        entry = self.entries.pop((scope, key), None)
        if not any(s == scope for s, _ in self.entries):
            self.since.pop(scope, None)
        return None if entry is None else entry[0]

    def put(self, scope: int, key: int, value: Any, weight: int) -> list[tuple[int, int]]:
        self.pop(scope, key)
        self.since.setdefault(scope, next(self.clock))
        self.entries[(scope, key)] = [value, weight, next(self.clock)]
        evicted = []
        while len(self.entries) > 1:
            count_over = len(self.entries) > self.max_entries
            weight_over = self.max_weight is not None and sum(e[1] for e in self.entries.values()) > self.max_weight
            if not (count_over or weight_over):
                break
            others = [k for k in self.entries if k != (scope, key)]  # never the entry just put
            scopes = {s for s, _ in others}
            # the most held; a tie to the scope putting, then to the one holding entries the longest
            victim = max(scopes, key=lambda s: (self.held(s, not count_over), s == scope, -self.since[s]))
            oldest = min((k for k in others if k[0] == victim), key=lambda k: self.entries[k][2])
            self.pop(*oldest)
            evicted.append(oldest)
        return evicted

    def keys(self) -> dict[int, list[int]]:
        order = sorted(self.since, key=self.since.__getitem__)
        return {s: [k for (t, k) in sorted(self.entries, key=lambda k: self.entries[k][2]) if t == s] for s in order}


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 3), st.integers(0, 5), st.integers(0, 40)),
        st.tuples(st.just("get"), st.integers(0, 3), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("pop"), st.integers(0, 3), st.integers(0, 5), st.none()),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.one_of(st.none(), st.integers(1, 100)), OPS)
def test_the_fair_lru_matches_a_naive_reference(max_entries: int, max_weight: int | None, ops: list[Any]) -> None:
    lru: FairLRU[int, str] = FairLRU(max_entries, max_weight)
    ref = Naive(max_entries, max_weight)
    for n, (op, scope, key, arg) in enumerate(ops):
        if op == "put":
            assert lru.put(scope, key, f"v{n}", arg) == ref.put(scope, key, f"v{n}", arg)
            over = len(lru) > max_entries or (max_weight is not None and lru.weight > max_weight)
            assert not over or len(lru) == 1  # the bound holds, but for the newest entry alone
            assert lru.get(scope, key, touch=False) == f"v{n}"  # the newest always stays
        elif op == "get":
            assert lru.get(scope, key, touch=arg) == ref.get(scope, key, arg)
        else:
            assert lru.pop(scope, key) == ref.pop(scope, key)
        assert lru.keys() == ref.keys()
        assert len(lru) == len(ref.entries) and lru.weight == sum(e[1] for e in ref.entries.values())
        for scope, keys in ref.keys().items():
            weights = [ref.entries[(scope, k)][1] for k in keys]
            assert lru.held(scope) == (len(keys), sum(weights)) and lru.oldest(scope) == keys[0]
        assert lru.held("none") == (0, 0) and lru.oldest("none") is None


def test_a_scope_under_its_share_keeps_its_entries() -> None:
    lru: FairLRU[int, int] = FairLRU(4)
    lru.put("quiet", 0, 0)
    for i in range(100):
        lru.put("busy", i, i)
    assert lru.keys() == {"quiet": [0], "busy": [97, 98, 99]}


@pytest.mark.parametrize(("entries", "weight"), [(0, None), (1, 0)])
def test_bounds_below_one_are_refused(entries: int, weight: int | None) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FairLRU(entries, weight)
