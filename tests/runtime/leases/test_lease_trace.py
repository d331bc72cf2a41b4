"""Lease hints through recording and replay: `--record-trace` writes each request's `retain_for` (only when it gave
one), the simulator's reader takes the recorded file, and a replay of an agent token trace passes each request's
hint to the engine as `retain_for`, so recording that replay writes the trace's hints back."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from radixcache.runtime.replay import ReplayConfig, load_replay_trace, replay
from radixcache.trace import read_trace
from radixcache.trace.agent_sessions import agent_sessions
from radixcache.trace.token_trace import write_token_jsonl
from tests.runtime.leases.conftest import prompt


def _lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_the_recorder_writes_the_hint_only_when_given(make_engine, tmp_path: Path) -> None:
    engine = make_engine()
    path = tmp_path / "recorded.jsonl"
    engine.record_trace(path)
    engine.generate(prompt(0, 12), 3, retain_for=12.5, session="agent-0")
    engine.generate(prompt(1, 12), 3)
    engine.generate(prompt(2, 12), 3, retain_for=0)
    engine.record_trace(None)
    lines = _lines(path)
    assert [line.get("retain_for") for line in lines] == [12.5, None, 0.0]
    assert "retain_for" not in lines[1]
    trace = read_trace(str(path))  # the Mooncake reader (radixcache simulate --leases) keeps the hints
    assert [r.retain_for for r in trace.records] == [12.5, None, 0.0]


def test_a_replay_passes_the_trace_s_hints_as_leases(make_engine, tmp_path: Path) -> None:
    requests = list(
        agent_sessions(
            agents=2,
            steps=(2, 3),
            system_tokens=12,
            tools_tokens=12,
            task_tokens=8,
            action_tokens=4,
            tool_output_tokens=(2, 6),
            vocab=90,
            seed=4,
        )
    )
    requests = [
        r.__class__(r.timestamp_ms, tuple(t + 1 for t in r.tokens), r.output_length, r.session, retain_for=r.retain_for)
        for r in requests
    ]  # ids 1..90: the tiny vocabulary
    source = tmp_path / "agents.jsonl"
    write_token_jsonl(source, requests)
    engine = make_engine(capacity_blocks=128)
    recorded = tmp_path / "replayed.jsonl"
    result = replay(engine, load_replay_trace(source), ReplayConfig(warmup=False), record_trace=recorded)
    assert len(result.requests) == len(requests) and not result.skipped
    hints = sorted((r.session, r.timestamp_ms, r.retain_for) for r in requests)
    assert any(h[2] is not None for h in hints) and any(h[2] is None for h in hints)  # the last turns have none
    lines = _lines(recorded)
    by_session: dict[str, list] = {}
    for line in lines:
        by_session.setdefault(line["session_id"], []).append(line.get("retain_for"))
    for session in {r.session for r in requests}:
        expected = [r.retain_for for r in requests if r.session == session]
        assert by_session[session] == pytest.approx(expected)
    assert engine.kv.leases.granted == sum(1 for r in requests if r.retain_for)
