"""Fixtures for the lease tests (radixcache.runtime.kv.leases): a tiny random model, a clock the test advances
(the engine's `lease_clock`), and engines built on both, whose invariants are checked after every scheduler step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.testing import RandomModel, tiny_model

PAGE = 4


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="session")
def tiny() -> RandomModel:
    return tiny_model(seed=5)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def check_leases(engine: Engine) -> None:
    """The tree's invariants, and the lease table's: every lease's node is locked, within the budget."""
    cache, leases = engine.cache, engine.kv.leases
    cache.check_invariants()
    assert leases.blocks <= leases.max_blocks
    for lease in leases._leases.values():
        assert lease.node.lock_ref >= 1 and lease.deadline > -1
    assert len(set(map(id, leases._leases.values()))) == len(leases)


@pytest.fixture
def make_engine(tiny: RandomModel, clock: FakeClock) -> Iterator[Callable[..., Engine]]:
    """make_engine(**options): an Engine on the tiny model and the test's clock, checked after every step."""
    engines: list[Engine] = []

    def make(**options: Any) -> Engine:
        options.setdefault("capacity_blocks", 64)
        options.setdefault("page_size", PAGE)
        options.setdefault("lease_clock", clock)
        options.setdefault("threads", 1)  # a tiny model: more threads only contend on a busy machine
        engine = Engine(tiny, **options)
        step = engine.scheduler.step

        def checked_step() -> None:
            step()
            check_leases(engine)

        engine.scheduler.step = checked_step  # type: ignore[method-assign]
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def prompt(seed: int, n: int) -> list[int]:
    """n token ids (1..90) that differ from another seed's from the first token."""
    return [1 + (seed * 31 + 7 * i + i * i) % 90 for i in range(n)]
