"""What a replay runs: the trace (the sample one, or a file), its conversations or token requests planned as
sessions, their turns in replay order, and each turn's start offset when timestamps are honoured.

Conversations interleave turn by turn (turn 1 of every conversation, then turn 2, ...), as users who think between
turns do; token requests run in arrival order, grouped by session (runtime.replay.run drives them).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from math import isfinite
from numbers import Integral, Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixcache.runtime.replay.results import ReplayError
from radixcache.trace import Conversation, Trace, TraceError, read_trace
from radixcache.trace.records import TokenRequest

if TYPE_CHECKING:
    from radixcache.runtime.engine.protocol import GenerationEngine

SAMPLE_TRACE = "sample_chat.jsonl"
MAX_WAIT_S = threading.TIMEOUT_MAX  # the longest wait time.sleep takes (an int64 of nanoseconds)
LONG_WAIT_S = 3600.0  # a replay that waits longer for its timestamps gets a warning first

# ---------------------------------------------------------------------------------------------- traces


def sample_trace_path() -> Path:
    """The sample trace shipped in the package: 8 conversations over 2 shared system prompts, 28 turns."""
    return Path(str(resources.files("radixcache.data").joinpath(SAMPLE_TRACE)))


def load_replay_trace(path: str | Path | None = None, format: str | None = None) -> Trace:
    """A text or token trace to replay (the sample trace when `path` is None). Hash-block traces are refused."""
    source = str(sample_trace_path() if path is None else path)
    trace = read_trace(source, format)
    if trace.kind == "hash":
        raise TraceError(
            source, "format", f"{trace.format} traces hold hash ids, not tokens or text: simulate them instead"
        )
    if not trace.records:
        raise TraceError(source, "1", "the trace holds no requests")
    return trace


# ---------------------------------------------------------------------------------------------- sessions


@dataclass(slots=True)
class TraceSession:
    """One conversation's progress: its pending turns and the chat history so far."""

    id: str
    index: int
    conversation: Conversation | None = None
    requests: list[TokenRequest] = field(default_factory=list)
    history: list[dict[str, str]] = field(default_factory=list)
    done: bool = False

    @property
    def turns(self) -> int:
        return len(self.conversation.turns) if self.conversation is not None else len(self.requests)


def plan_sessions(
    trace: Trace | Sequence[Conversation] | Sequence[TokenRequest], limit: int | None = None
) -> list[TraceSession]:
    """Conversations (or token requests grouped by session, in first-appearance order), the first `limit`."""
    if not isinstance(trace, (Trace, Iterable)):  # None was a TypeError from list()
        raise ReplayError(f"trace must be a Trace or a list of conversations or token requests, got {trace!r:.40}")
    records = list(trace.records if isinstance(trace, Trace) else trace)
    sessions: list[TraceSession] = []
    by_key: dict[Any, TraceSession] = {}
    names: set[str] = set()  # a session's name is its requests' `conversation`: one name, one session
    for i, record in enumerate(records):
        if isinstance(record, Conversation):
            sessions.append(TraceSession(_unique(record.id, names), len(sessions), conversation=record))
        elif isinstance(record, TokenRequest):
            key = record.session if record.session is not None else ("request", i)
            session = by_key.get(key)
            if session is None:
                name = record.session if record.session is not None else f"request-{i + 1}"
                session = by_key[key] = TraceSession(_unique(str(name), names), len(sessions))
                sessions.append(session)
            session.requests.append(record)
        else:
            raise ReplayError(f"cannot replay a {type(record).__name__}: give text conversations or token requests")
    return sessions[:limit] if limit is not None else sessions


def _unique(name: str, taken: set[str]) -> str:
    """`name`, or `name#2`, `name#3`, ... when a session before has it (a trace that repeats a conversation's id):
    records, the comparison of two runs and a recorded trace's sessions tell sessions apart by name."""
    unique, n = name, 1
    while unique in taken:
        n += 1
        unique = f"{name}#{n}"
    taken.add(unique)
    return unique


def replay_order(sessions: list[TraceSession]) -> list[tuple[TraceSession, int]]:
    """Turns in replay order: token requests by arrival time (file order on ties), conversations turn by turn."""
    steps = [(s, k) for s in sessions for k in range(s.turns)]
    if sessions and sessions[0].conversation is None:
        position = {id(r): n for n, r in enumerate(r for s in sessions for r in s.requests)}
        return sorted(steps, key=lambda sk: (sk[0].requests[sk[1]].timestamp_ms, position[id(sk[0].requests[sk[1]])]))
    return sorted(steps, key=lambda sk: (sk[1], sk[0].index))


def start_offsets(
    sessions: list[TraceSession], honor: bool, warn: Callable[[str], None]
) -> dict[tuple[int, int], float]:
    """Start offsets in seconds of each (session, turn), when asked for and the trace has them."""
    if not honor:
        return {}
    if not sessions or sessions[0].conversation is not None:
        warn("the trace has no timestamps (text traces carry none); --honor-timestamps has no effect")
        return {}
    first = min(r.timestamp_ms for s in sessions for r in s.requests)
    offsets = {(s.index, k): (r.timestamp_ms - first) / 1000.0 for s in sessions for k, r in enumerate(s.requests)}
    (index, k), span = max(offsets.items(), key=lambda item: item[1])
    if span > MAX_WAIT_S:  # time.sleep raised OverflowError mid-run, after the requests before it
        last = sessions[index].requests[k]
        where = last.source or f"session {sessions[index].id} request {k + 1}"
        raise ReplayError(
            f"{where}: timestamp {last.timestamp_ms:g} ms is {span:.3g} s after the first request's, longer than "
            "--honor-timestamps can wait"
        )
    if span > LONG_WAIT_S:
        warn(f"the trace's timestamps span {span / 3600:,.1f} hours: --honor-timestamps replays it that slowly")
    return offsets


def check_tokens(sessions: list[TraceSession], engine: GenerationEngine, max_tokens: int | None = None) -> None:
    """Refuse, before anything runs, a text trace without a tokenizer, token ids the model cannot read, and fields
    of the types the trace readers would have refused (records built in Python are not read through them): else
    such a turn failed mid-run, after the turns before it, with a ValueError that named no request. An output_length
    of 0 is refused too, unless `max_tokens` replaces every request's limit: the engine cannot generate nothing, and
    the replay ran such a request with the default limit (32 tokens) as if it had none. A request read
    from a file is named by its file:line (`TokenRequest.source`), as the readers name the records they refuse."""
    vocab = engine.config.vocab_size
    needs_tokenizer = any(s.conversation is not None for s in sessions)
    if needs_tokenizer and getattr(engine, "tokenizer", None) is None:
        raise ReplayError("a text trace needs the model's tokenizer, and this engine has none")
    for s in sessions:
        if s.conversation is not None:
            for k, turn in enumerate(s.conversation.turns):
                where, limit = f"conversation {s.id} turn {k + 1}", turn.max_tokens
                if not isinstance(turn.user, str):
                    raise ReplayError(f"{where}: user must be a str, got {turn.user!r:.40}")
                if limit is not None and (not _is_int(limit) or limit < 1):
                    raise ReplayError(f"{where}: max_tokens must be an int >= 1, got {limit!r}")
        for k, r in enumerate(s.requests):
            # file:line, as the trace readers name a record; a request built in Python by its session and place
            where = r.source or f"session {s.id} request {k + 1}"
            odd = next((t for t in r.tokens if not _is_int(t) or t < 0), None)
            if odd is not None:
                raise ReplayError(f"{where}: token {odd!r} is not a token id (an int >= 0)")
            bad = next((t for t in r.tokens if t >= vocab), None)
            if bad is not None:
                raise ReplayError(f"{where}: token id {bad} is outside the model's vocabulary of {vocab}")
            if not r.tokens:
                raise ReplayError(f"{where}: the prompt is empty")
            if not _is_int(r.output_length) or r.output_length < 0:
                raise ReplayError(f"{where}: output_length must be an int >= 0, got {r.output_length!r}")
            if r.output_length == 0 and max_tokens is None:  # a max_tokens (--max-tokens) replaces every limit
                raise ReplayError(
                    f"{where}: output_length is 0, but the engine generates at least one token per request (its "
                    "prefill's); give every request a limit with --max-tokens (ReplayConfig.max_tokens)"
                )
            if isinstance(r.timestamp_ms, bool) or not isinstance(r.timestamp_ms, Real) or not isfinite(r.timestamp_ms):
                raise ReplayError(f"{where}: timestamp_ms must be a finite number, got {r.timestamp_ms!r}")
            hint = r.retain_for
            if hint is not None and (isinstance(hint, bool) or not isinstance(hint, Real) or not hint >= 0):
                raise ReplayError(f"{where}: retain_for must be a number of seconds >= 0 or None, got {hint!r}")


def check_trace_for_model(
    trace: Trace | Sequence[Conversation] | Sequence[TokenRequest],
    limit: int | None,
    model: str,
    max_tokens: int | None = None,
) -> Any:
    """`check_tokens` against `model`'s config and tokenizer alone (no weights): `replay --replicas` checks the trace
    so before Ray and the replicas start, which took seconds before a token id outside the vocabulary was refused.
    `max_tokens`: as `check_tokens`' (the replay's `--max-tokens`, which lets an output_length of 0 run). Returns
    the tokenizer (None if the model has none), for the caller's further checks (a text trace's chat template)."""
    from types import SimpleNamespace

    from radixcache.runtime.loading import load_config_and_tokenizer

    config, tokenizer = load_config_and_tokenizer(model)
    engine = SimpleNamespace(config=config, tokenizer=tokenizer)
    check_tokens(plan_sessions(trace, limit), engine, max_tokens)  # type: ignore[arg-type]
    return tokenizer


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)
