"""A `lease_clock` that fails (the caller's code: it raises, or gives NaN) fails no request: the step read it outside
the per-request guards, so every request in flight failed at every step while a lease was held. The tree's
invariants and the lease table's are checked after every scheduler step (conftest.make_engine)."""

from __future__ import annotations

import math

import pytest

from radixcache.runtime.kv.leases import NO_LEASE
from tests.runtime.leases.conftest import FakeClock, prompt


class BrokenClock(FakeClock):
    """A FakeClock that fails while `broken` is set: with `error` raised, or `value` returned."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = False
        self.error: Exception | None = None
        self.value: object = None

    def __call__(self) -> float:
        if not self.broken:
            return self.now
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


@pytest.mark.parametrize("fault", ["raises", "nan", "string"])
def test_a_failing_lease_clock_fails_no_request_and_leaves_the_locks_as_they_were(make_engine, fault):
    clock = BrokenClock()
    engine = make_engine(capacity_blocks=64, lease_clock=clock)
    reference = make_engine(capacity_blocks=64, enable_cache=False)
    first = engine.generate(prompt(0, 24), 5, retain_for=10, ignore_eos=True)
    held = engine.check()["leased_blocks"]
    assert first.lease.granted and held > 0
    clock.broken = True
    clock.error = RuntimeError("the clock's server is down") if fault == "raises" else None
    clock.value = math.nan if fault == "nan" else "12:00"
    prompts = [prompt(0, 24) + prompt(5, 8), prompt(1, 30), prompt(2, 17)]  # a hit on the leased context, and new
    got = engine.generate(prompts, 6, ignore_eos=True)
    want = reference.generate(prompts, 6, ignore_eos=True)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    asked = engine.generate(prompt(3, 20), 4, retain_for=5, ignore_eos=True)  # asked for a lease: none is timed
    assert asked.lease == NO_LEASE
    assert asked.token_ids == reference.generate(prompt(3, 20), 4, ignore_eos=True).token_ids
    g = engine.check()  # the gauges read the clock too
    assert (g["leases"], g["leased_blocks"], g["locked_blocks"]) == (1, held, held)  # the first lease, kept
    clock.broken = False
    clock.advance(10)  # working again, past the first lease's deadline: it expires
    g = engine.check()
    assert (g["leases"], g["leased_blocks"], g["locked_blocks"]) == (0, 0, 0)
    assert engine.generate(prompt(4, 20), 2, retain_for=5).lease.granted
