"""LoadCosts, the decision to load a page found below the device or recompute it: a tier's cost is the median of its
last WINDOW loads per page, no tier is declined on fewer than MIN_SAMPLES measured loads, and a declined tier is
measured again (a probe) after PROBE_FIRST declines, then after twice as many each time the probe finds it still
dearer, up to PROBE_MAX.

The expectations come from a plain model of the rule written here (`Rule`), not from the class under test."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixcache.runtime.kv.tier.load_costs import LoadCosts

PAGE = 4
SLOW, FAST = 1.0, 1e-6  # seconds per page: far dearer, far cheaper than recomputing PAGE tokens at 1 ms each


def _costs(mode: str = "auto") -> LoadCosts:
    costs = LoadCosts(mode, PAGE)
    costs.note_prefill(1000, 1.0)  # 1 ms a token: recomputing a page costs 4 ms
    return costs


def test_a_tier_is_loaded_until_it_is_measured_and_while_it_has_fewer_than_min_samples_loads() -> None:
    costs = LoadCosts("auto", PAGE)
    assert costs.choose("disk")  # nothing measured
    costs.note_load("disk", 2, 2 * SLOW)
    assert costs.choose("disk")  # prefill unmeasured
    costs.note_prefill(1000, 1.0)
    for _ in range(LoadCosts.MIN_SAMPLES - 1):
        assert costs.worth_loading("disk") and costs.choose("disk")  # one slow load is not enough to decline
        costs.note_load("disk", 2, 2 * SLOW)
    assert not costs.worth_loading("disk") and not costs.choose("disk")
    assert costs.choose("host")  # each tier is measured apart


def test_one_slow_load_among_fast_ones_changes_no_decision() -> None:
    costs = _costs()
    costs.note_load("disk", 2, 2 * SLOW)  # a cold file on a busy machine: a second a page
    costs.note_load("disk", 30, 30 * FAST)
    costs.note_load("disk", 9, 9 * FAST)
    assert costs.load_s_per_page("disk") == pytest.approx(FAST) and costs.choose("disk")
    costs.note_load("disk", 8, 8 * SLOW)  # two of five: still the fast median
    assert costs.choose("disk")
    for _ in range(LoadCosts.WINDOW):  # the disk really got slow: the window turns
        costs.note_load("disk", 8, 8 * SLOW)
    assert not costs.choose("disk")


def _measured_slow() -> LoadCosts:
    costs = _costs()
    for _ in range(LoadCosts.MIN_SAMPLES):
        costs.note_load("disk", 3, 3 * SLOW)
    return costs


def test_a_declined_tier_is_probed_after_probe_first_declines_and_resumes_when_the_probe_is_cheap() -> None:
    costs = _measured_slow()
    assert [costs.choose("disk") for _ in range(LoadCosts.PROBE_FIRST)] == [False] * LoadCosts.PROBE_FIRST
    assert costs.worth_loading("disk")  # a probe is due: the prefetch planner reads the pages ahead
    assert costs.choose("disk")  # the probe
    assert not costs.choose("disk")  # one probe at a time: the next request is declined until it is measured
    costs.note_load("disk", 30, 30 * FAST)  # the probe: the disk is fast now (the first loads were a busy moment)
    assert costs.load_s_per_page("disk") == pytest.approx(FAST)  # the probe replaced the stale averages
    assert all(costs.choose("disk") for _ in range(50))  # loads resume at once


def test_probes_that_find_the_tier_still_dearer_back_off_to_probe_max() -> None:
    costs = _measured_slow()
    gaps, declines = [], 0
    for _ in range(3000):
        if costs.choose("disk"):
            gaps.append(declines)
            declines = 0
            costs.note_load("disk", 3, 3 * SLOW)  # still dearer
        else:
            declines += 1
    first, top = LoadCosts.PROBE_FIRST, LoadCosts.PROBE_MAX
    assert gaps[:6] == [first, 2 * first, 4 * first, 8 * first, 16 * first, 32 * first][: len(gaps[:6])]
    assert gaps == [min(first << i, top) for i in range(len(gaps))]
    assert len(gaps) <= 6 + 3000 // top


def test_a_probe_whose_load_fails_is_followed_by_another_after_as_many_declines() -> None:
    costs = _measured_slow()
    for _ in range(LoadCosts.PROBE_FIRST):
        assert not costs.choose("disk")
    assert costs.choose("disk")  # the probe; its read fails, so no load is measured
    assert [costs.choose("disk") for _ in range(LoadCosts.PROBE_FIRST + 1)] == [False] * LoadCosts.PROBE_FIRST + [True]


def test_fixed_modes_ignore_the_measurements_and_bad_arguments_are_refused() -> None:
    for mode, want in (("always", True), ("never", False)):
        costs = _costs(mode)
        for _ in range(LoadCosts.MIN_SAMPLES):
            costs.note_load("disk", 1, SLOW if want else FAST)
        assert [costs.choose("disk") for _ in range(300)] == [want] * 300
    with pytest.raises(ValueError, match="load_back"):
        LoadCosts("sometimes")
    with pytest.raises(ValueError, match="page_size"):
        LoadCosts("auto", 0)


class Rule:
    """The rule as documented, kept naively: every load's seconds per page in a list; the cost is the median of the
    last WINDOW (the lower of the two middle ones for an even count)."""

    def __init__(self) -> None:
        self.prefill: float | None = None
        self.loads: list[float] = []
        self.declines, self.after, self.probing = 0, LoadCosts.PROBE_FIRST, False

    def cheaper(self) -> bool:
        if self.prefill is None or len(self.loads) < LoadCosts.MIN_SAMPLES:
            return True
        last = sorted(self.loads[-LoadCosts.WINDOW :])
        return last[(len(last) - 1) // 2] < PAGE * self.prefill  # the lower middle of an even count

    def worth(self) -> bool:
        return not self.loads or self.cheaper() or self.declines >= self.after

    def choose(self) -> bool:
        load = self.worth()
        if self.loads and not self.cheaper():
            if load:
                self.probing, self.declines = True, 0
            else:
                self.declines += 1
        return load

    def note_load(self, pages: int, seconds: float) -> None:
        if self.probing:  # a probe's measurement replaces the window, keeping the count of loads
            self.loads = [seconds / pages] * len(self.loads)
        self.loads.append(seconds / pages)
        was_probe, self.probing, self.declines = self.probing, False, 0
        if self.cheaper():
            self.after = LoadCosts.PROBE_FIRST
        elif was_probe:
            self.after = min(2 * self.after, LoadCosts.PROBE_MAX)

    def note_prefill(self, tokens: int, seconds: float) -> None:
        new = seconds / tokens
        self.prefill = new if self.prefill is None else 0.8 * self.prefill + 0.2 * new


_events = st.lists(
    st.one_of(
        st.tuples(st.just("choose")),
        st.tuples(st.just("load"), st.integers(1, 64), st.sampled_from([1e-6, 1e-3, 4e-3, 5e-3, 0.1])),
        st.tuples(st.just("prefill"), st.integers(1, 512), st.sampled_from([1e-4, 1e-3, 5e-3])),
    ),
    max_size=200,
)


@given(_events)
def test_the_decisions_follow_the_documented_rule_for_any_order_of_events(events: list[tuple]) -> None:
    costs, rule = LoadCosts("auto", PAGE), Rule()
    for event in events:
        if event[0] == "choose":
            assert costs.worth_loading("disk") == rule.worth()
            assert costs.choose("disk") == rule.choose()
        elif event[0] == "load":
            pages, per_page = event[1], event[2]
            costs.note_load("disk", pages, pages * per_page)
            rule.note_load(pages, pages * per_page)
        else:
            costs.note_prefill(event[1], event[1] * event[2])
            rule.note_prefill(event[1], event[1] * event[2])
