"""Hostile sampling values from hypothesis strategies, submitted beside a greedy bystander through the engine API:
each is refused at the door with a ValueError naming a field, or runs (finishing, or failing alone with
SamplingError); the bystander's output always equals its output alone, and the cache is clean after each."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import SamplingError
from radixcache.runtime.testing import RandomModel, hold_engine_loop
from tests.runtime.faults.conftest import assert_clean, ids

HOSTILE_FLOATS = st.sampled_from(
    [1e-40, 1e-300, 5e-324, 1e-5, 9.99e-6, -0.0, 1e300, 1e38, -1e-40, math.nan, math.inf, -math.inf, 2.0, 0.01]
)
ANY_VALUE = st.one_of(
    HOSTILE_FLOATS,
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
    st.lists(st.integers(-5, 200), max_size=3),
)
FIELDS = [
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
    "stop",
    "stop_token_ids",
    "logit_bias",
    "timeout",
    "priority",
]
KWARGS = st.dictionaries(
    st.sampled_from(FIELDS),
    ANY_VALUE | st.dictionaries(st.one_of(st.integers(-3, 120), st.text(max_size=2)), ANY_VALUE, max_size=2),
    max_size=4,
)
BYSTANDER = 16


@pytest.fixture(scope="module")
def setup(tiny: RandomModel) -> tuple[Engine, list[int], tuple[int, ...]]:
    prompt = ids(20, 31)
    with Engine(tiny, capacity_blocks=64, page_size=16, dtype="float64") as ref:
        alone = ref.generate(prompt, BYSTANDER, ignore_eos=True).token_ids
    return Engine(tiny, capacity_blocks=64, page_size=16, dtype="float64"), prompt, alone


@pytest.mark.slow  # about 1.6 s: 60 examples
@settings(max_examples=60)
@given(kwargs=KWARGS, max_new=st.one_of(st.integers(-2, 6), ANY_VALUE))
def test_hostile_sampling_values_never_touch_a_bystander(
    setup: tuple[Engine, list[int], tuple[int, ...]], kwargs: dict[str, Any], max_new: Any
) -> None:
    engine, prompt, alone = setup
    if isinstance(max_new, int) and not isinstance(max_new, bool) and max_new > 6:
        max_new = 6  # a valid but long request only costs time
    if "timeout" in kwargs and isinstance(kwargs["timeout"], (int, float)) and not isinstance(kwargs["timeout"], bool):
        kwargs["timeout"] = None if kwargs["timeout"] < 5 else kwargs["timeout"]  # a short timeout is a valid ending
    release = hold_engine_loop(engine)
    try:
        mine = engine.submit(prompt, BYSTANDER, ignore_eos=True)
        try:
            theirs = engine.submit(ids(12, 32), max_new, ignore_eos=True, **kwargs)
        except ValueError as exc:  # refused at the door, naming the field
            assert any(name in str(exc) for name in [*kwargs, "max_new_tokens", "params"]), str(exc)
            theirs = None
    finally:
        release()
    assert mine.result(60).token_ids == alone
    if theirs is not None:
        with contextlib.suppress(SamplingError):  # it failed alone
            assert theirs.result(60).finish_reason in ("length", "stop")
    assert_clean(engine)
