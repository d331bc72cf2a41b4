"""The agent-session generator (radixcache.trace.agent_sessions): deterministic per seed, pauses and tool outputs
within their stated log-uniform bounds, shared system prompt and tools, lease hints equal to the next pause."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.trace.agent_sessions import agent_sessions, log_uniform


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    assert agent_sessions(agents=3, seed=5) == agent_sessions(agents=3, seed=5)
    assert agent_sessions(agents=3, seed=5) != agent_sessions(agents=3, seed=6)


def test_pauses_hints_and_tool_outputs_stay_in_bounds() -> None:
    requests = agent_sessions(agents=6, pause_s=(2.0, 30.0), tool_output_tokens=(50, 800), seed=3)
    times = [r.timestamp_ms for r, _ in requests]
    assert times == sorted(times)
    sessions: dict[str, list] = {}
    for request, hint in requests:
        sessions.setdefault(request.session, []).append((request, hint))
    shared = requests[0][0].tokens[:1800]
    for steps in sessions.values():
        assert steps[-1][1] is None  # the last step has no lease
        for (a, hint), (b, _) in itertools.pairwise(steps):
            pause_ms = b.timestamp_ms - a.timestamp_ms
            assert 2000 - 1 <= pause_ms <= 30000 + 1
            assert hint == pytest.approx(pause_ms / 1000, abs=2e-3)  # hint_error 1: the exact pause
            assert (
                b.tokens[: len(a.tokens)] == a.tokens
                and b.tokens[len(a.tokens) : len(a.tokens) + a.output_length] == a.output_tokens
            )
            tool = len(b.tokens) - len(a.tokens) - a.output_length
            assert 50 <= tool <= 800
        assert steps[0][0].tokens[:1800] == shared  # one system prompt and tool block for every agent


@settings(max_examples=50, deadline=None, derandomize=True)
@given(st.floats(0.01, 100), st.floats(1, 100), st.integers(0, 2**32))
def test_log_uniform_bounds(lo: float, factor: float, seed: int) -> None:
    value = log_uniform(random.Random(seed), lo, lo * factor)
    assert lo * (1 - 1e-9) <= value <= lo * factor * (1 + 1e-9)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="pause_s"):
        agent_sessions(pause_s=(0.0, 1.0))
    with pytest.raises(ValueError, match="hint_error"):
        agent_sessions(hint_error=0.5)
