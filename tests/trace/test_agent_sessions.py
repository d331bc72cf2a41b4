"""The agent-session generator (radixcache.trace.agent_sessions): deterministic per seed, pauses and tool outputs
within their stated log-uniform bounds, shared system prompt and tools, lease hints equal to the next pause; the
token trace formats carry the hint (`retain_for`) both ways, refuse bad values naming file, line and field, and
still read traces without it; `radixcache trace gen agent-sessions` writes it."""

from __future__ import annotations

import itertools
import random

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.cli.main import main as cli_main
from radixcache.trace.agent_sessions import agent_sessions, log_uniform
from radixcache.trace.errors import TraceError
from radixcache.trace.token_trace import (
    iter_token_arrays,
    iter_token_jsonl,
    iter_token_msgpack,
    write_token_jsonl,
    write_token_msgpack,
)


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    assert list(agent_sessions(agents=3, seed=5)) == list(agent_sessions(agents=3, seed=5))
    assert list(agent_sessions(agents=3, seed=5)) != list(agent_sessions(agents=3, seed=6))


def test_pauses_hints_and_tool_outputs_stay_in_bounds() -> None:
    requests = [
        (r, r.retain_for) for r in agent_sessions(agents=6, pause_s=(2.0, 30.0), tool_output_tokens=(50, 800), seed=3)
    ]
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


def test_the_hint_round_trips_through_jsonl_and_msgpack(tmp_path) -> None:
    requests = list(agent_sessions(agents=2, steps=(2, 3), seed=1))
    assert any(r.retain_for is not None for r in requests) and any(r.retain_for is None for r in requests)
    write_token_jsonl(tmp_path / "a.jsonl", requests)
    write_token_msgpack(tmp_path / "a.msgpack", requests)
    assert list(iter_token_jsonl(tmp_path / "a.jsonl")) == requests
    assert list(iter_token_msgpack(tmp_path / "a.msgpack")) == requests


def test_old_traces_read_and_bad_hints_are_refused_with_file_and_line(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "tokens": [1, 2], "output_length": 0}\n')
    assert next(iter_token_jsonl(path)).retain_for is None
    for bad in ("-1", '"5"', "true", "1e12"):
        path.write_text(
            '{"timestamp": 0, "tokens": [1], "output_length": 0}\n'
            f'{{"timestamp": 1, "tokens": [1], "output_length": 0, "retain_for": {bad}}}\n'
        )
        with pytest.raises(TraceError) as caught:
            list(iter_token_jsonl(path))
        assert f"{path}:2" in str(caught.value) and "retain_for" in str(caught.value)


def test_trace_gen_writes_agent_sessions_with_hints(tmp_path) -> None:
    out = tmp_path / "agents.jsonl"
    result = CliRunner().invoke(
        cli_main, ["trace", "gen", "agent-sessions", str(out), "--count", "2", "--set", "pause_s=3,4"]
    )
    assert result.exit_code == 0, result.output
    hints = [r.retain_for for r in iter_token_jsonl(out)]
    assert all(h is None or 3 <= h <= 4 for h in hints) and any(h is not None for h in hints)


def test_the_simulators_fast_reader_refuses_a_bad_hint_as_the_careful_reader_does(tmp_path) -> None:
    """iter_token_arrays (the streamed simulator's reader) used to pass a bad retain_for silently."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "tokens": [1], "output_length": 0, "retain_for": 2.5}\n')
    assert len(list(iter_token_arrays(path))) == 1
    path.write_text('{"timestamp": 0, "tokens": [1], "output_length": 0, "retain_for": -2}\n')
    with pytest.raises(TraceError, match="retain_for"):
        list(iter_token_arrays(path))


@pytest.mark.parametrize(
    "args", [{"pause_s": (2.0, float("inf"))}, {"hint_error": 1e300}, {"hint_error": float("inf")}]
)
def test_hints_the_readers_would_refuse_are_refused_on_the_call(args: dict) -> None:
    """A lease hint is at most pause_s[1] * hint_error seconds, and the trace readers take at most 1e9: past it,
    `trace gen` wrote a trace (with Infinity, or a huge retain_for) that its own readers refused."""
    with pytest.raises(ValueError, match=r"hint_error|pause_s"):
        agent_sessions(**args)
