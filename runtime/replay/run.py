"""Replay a chat trace through an Engine and measure what the prefix cache saves.

A trace is text conversations (ShareGPT, conversation JSONL, OpenAI messages) or token requests (token JSONL or
msgpack). Text turns are rendered with the model's chat template, in one of two modes:

- `live`: the model's own replies become the history of the next turn, as in a real chat;
- `recorded`: the trace's recorded assistant replies are the history (the model's reply where none is
  recorded); the model still generates up to the turn's token limit, for timing.

Token requests go to the engine as they are (their prompts already hold the history), so both modes agree; a
token request's lease hint (`retain_for`, runtime.kv.leases) goes with it, at most a day.
Conversations interleave turn by turn (turn 1 of every conversation, then turn 2, ...), as users who think
between turns do; token traces run in file (arrival) order. A turn whose prompt does not fit the model's
context is skipped and counted, and so is one that needs more KV pages than the cache holds. Ctrl-C
(KeyboardInterrupt) stops the run cleanly: the result holds what finished and says it was interrupted.

    from radixcache.runtime.engine.engine import Engine
    from radixcache.runtime.replay import ReplayConfig, load_replay_trace, replay

    result = replay(Engine("smollm2"), load_replay_trace(), ReplayConfig(limit=2, max_tokens=8))
    print(result.summary.hit_rate, result.summary.ttft_p50_s)

With `--concurrency N > 1` every conversation runs as its own task through `Engine.agenerate` (the
continuous-batching scheduler), with at most N requests in flight.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from radixcache.errors import CacheFullError
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.engine.protocol import GenerationEngine
from radixcache.runtime.kv.leases import MAX_RETAIN_FOR_S
from radixcache.runtime.replay.results import (
    SKIP_KV_FULL,
    SKIP_TOO_LONG,
    ReplayConfig,
    ReplayError,
    ReplayResult,
    RequestRecord,
    SkippedTurn,
    summarize,
)
from radixcache.runtime.replay.sessions import TraceSession, check_tokens, plan_sessions, replay_order, start_offsets
from radixcache.trace import Conversation, Trace
from radixcache.trace.records import TokenRequest

_WARMUP_NAMESPACE = "radixcache-replay-warmup"


class _Run:
    """State shared by the sequential and the concurrent drivers."""

    def __init__(
        self,
        engine: GenerationEngine,
        config: ReplayConfig,
        on_result: Callable[[RequestRecord | SkippedTurn], None] | None,
        on_warning: Callable[[str], None] | None,
    ) -> None:
        self.engine = engine
        self.config = config
        self.on_result = on_result
        self.on_warning = on_warning or (lambda message: None)
        self.records: list[RequestRecord] = []
        self.skipped: list[SkippedTurn] = []
        self.positions: dict[tuple[int, int], int] = {}  # (session, turn) -> its place in replay order
        self.recording = False  # a trace recorder is attached: requests carry their conversation's id
        self.t0 = time.perf_counter()

    def session_id(self, session: TraceSession) -> str | None:
        """The engine's `session` while recording, or where the engine routes by session (replicas behind a router:
        a conversation's turns then stay together, as the server's `user` field keeps them): the conversation's id,
        or a token request's own session."""
        if not (self.recording or getattr(self.engine, "routes_sessions", False)):
            return None
        return session.id if session.conversation is not None else session.requests[0].session

    def prepare(self, session: TraceSession, k: int) -> tuple[list[int], RequestOptions] | SkippedTurn:
        """The prompt ids and the request's options (token limit, sampling seed, namespace, ...) of turn k, or why
        it is skipped."""
        config = self.config
        if session.conversation is not None:
            turn = session.conversation.turns[k]
            if k == 0 and session.conversation.system is not None:
                session.history.append({"role": "system", "content": session.conversation.system})
            session.history.append({"role": "user", "content": turn.user})
            text = self.engine.tokenizer.apply_chat_template(session.history, add_generation_prompt=True)
            ids = list(self.engine.tokenizer.encode(text))
            limit, namespace, hint = turn.max_tokens, None, None
        else:
            request = session.requests[k]
            ids, limit, namespace = list(request.tokens), request.output_length, request.namespace  # >= 1: checked
            hint = None if request.retain_for is None else min(request.retain_for, MAX_RETAIN_FOR_S)  # a lease
        max_new = config.max_tokens or limit or config.default_max_tokens
        max_position = self.engine.config.max_position
        if len(ids) >= max_position:
            message = (
                f"{_where(session, k)}: {len(ids):,} prompt tokens do not fit the model's "
                f"context of {max_position:,}; skipped"
            )
            return self._skip(session, k, len(ids), SKIP_TOO_LONG, message)
        options = RequestOptions.of(
            max_new,
            caller="replay",
            seed=config.seed + self.positions.get((session.index, k), 0),
            temperature=config.temperature,
            namespace=namespace,
            session=self.session_id(session),
            retain_for=hint,
        )
        return ids, options

    def finish(self, session: TraceSession, k: int, result: Any, started: float) -> RequestRecord:
        conversation = session.conversation
        if conversation is not None:
            recorded = conversation.turns[k].assistant
            reply = recorded if self.config.mode == "recorded" and recorded is not None else result.text
            session.history.append({"role": "assistant", "content": reply})
        record = RequestRecord(
            conversation=session.id,
            turn=k + 1,
            prompt_tokens=result.prompt_tokens,
            cached_tokens=result.cached_tokens,
            prefill_tokens=result.prefill_tokens,
            output_tokens=len(result.token_ids),
            ttft_s=result.ttft_s,
            latency_s=result.latency_s,
            decode_tps=result.decode_tps,
            finish_reason=result.finish_reason,
            text=result.text,
            start_s=started - self.t0,
        )
        self.records.append(record)
        if self.on_result is not None:
            self.on_result(record)
        return record

    def kv_full(self, session: TraceSession, k: int, prompt_tokens: int, exc: CacheFullError) -> SkippedTurn:
        message = f"{_where(session, k)}: needs more KV than the cache can free ({exc}); skipped"
        return self._skip(session, k, prompt_tokens, SKIP_KV_FULL, message)

    def _skip(self, session: TraceSession, k: int, prompt_tokens: int, reason: str, message: str) -> SkippedTurn:
        # The history cannot go on without this turn's reply, and would only grow: the rest of a text
        # conversation is skipped with it. Token requests carry their own history, so only this one goes.
        skipped = [SkippedTurn(session.id, k + 1, prompt_tokens, reason, message)]
        if session.conversation is not None:
            session.done = True
            rest = range(k + 1, session.turns)
            skipped += [SkippedTurn(session.id, j + 1, 0, reason, f"{message} (turn {j + 1} follows it)") for j in rest]
        self.skipped.extend(skipped)
        self.on_warning(message)
        if self.on_result is not None:
            for s in skipped:
                self.on_result(s)
        return skipped[0]

    def sleep_until(self, offset_s: float | None) -> None:
        if offset_s is not None:
            delay = self.t0 + offset_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)


def _where(session: TraceSession, k: int) -> str:
    """How a warning names turn k: by its conversation, and a token request read from a file by its file:line too."""
    source = session.requests[k].source if session.conversation is None else None
    return f"conversation {session.id} turn {k + 1}" + (f" ({source})" if source else "")


def replay(
    engine: GenerationEngine,
    trace: Trace | Sequence[Conversation] | Sequence[TokenRequest],
    config: ReplayConfig | None = None,
    *,
    label: str | None = None,
    on_result: Callable[[RequestRecord | SkippedTurn], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    record_trace: str | os.PathLike[str] | None = None,
) -> ReplayResult:
    """Replay `trace` through `engine` (an `Engine`) and return per-request records and a summary.

    on_result is called after every finished (RequestRecord) or skipped (SkippedTurn) turn, on_warning with
    one-line messages (skipped turns, timestamps that cannot be honoured). KeyboardInterrupt ends the run
    early and the result says `interrupted`; the engine's cache stays consistent (it aborts the request).
    `record_trace`: write what the engine served (after the warm-up) to this file as a Mooncake-format hash trace
    (`Engine.record_trace`), each request tagged with its conversation's id; the file is closed when the run ends,
    and the result's `recorder` says how many lines it wrote and whether a write error stopped it (`stopped`).
    """
    config = _checked(config, label=label, on_result=on_result, on_warning=on_warning)
    sessions = plan_sessions(trace, config.limit)
    check_tokens(sessions, engine, config.max_tokens)
    if config.warmup:
        _warm_up(engine)
    if record_trace is None:
        return _replay(engine, sessions, config, label, on_result, on_warning, recording=False)
    recorder = engine.record_trace(record_trace)
    try:
        result = _replay(engine, sessions, config, label, on_result, on_warning, recording=True)
    finally:
        engine.record_trace(None)
    return replace(result, recorder=recorder)  # closed: `stopped` says whether it holds the whole run


def _checked(config: object, label: object = None, **callbacks: object) -> ReplayConfig:
    """`config` (None: the defaults), once it and the other arguments are of their types, else a ReplayError naming
    which: a dict for the config was an AttributeError, and a callback that is no function a TypeError at the first
    turn's end, after the warm-up and that turn's work."""
    if config is None:
        config = ReplayConfig()
    if not isinstance(config, ReplayConfig):
        raise ReplayError(f"config must be a ReplayConfig or None, got {type(config).__name__}")
    if label is not None and not isinstance(label, str):
        raise ReplayError(f"label must be a str or None, got {type(label).__name__}")
    bad = next((name for name, f in callbacks.items() if f is not None and not callable(f)), None)
    if bad is not None:
        raise ReplayError(f"{bad} must be a function or None, got {type(callbacks[bad]).__name__}")
    return config


def _replay(
    engine: GenerationEngine,
    sessions: list[TraceSession],
    config: ReplayConfig,
    label: str | None,
    on_result: Callable[[RequestRecord | SkippedTurn], None] | None,
    on_warning: Callable[[str], None] | None,
    *,
    recording: bool,
) -> ReplayResult:
    run = _Run(engine, config, on_result, on_warning)
    run.recording = recording
    run.positions = {(s.index, k): i for i, (s, k) in enumerate(replay_order(sessions))}
    tiers_before = _tier_counters(engine)
    offsets = start_offsets(sessions, config.honor_timestamps, run.on_warning)
    interrupted = False
    try:
        if config.concurrency > 1:
            asyncio.run(_drive_concurrent(run, sessions, offsets))
        else:
            _drive_sequential(run, sessions, offsets)
    except KeyboardInterrupt:
        interrupted = True
        wall = time.perf_counter() - run.t0
        _settle(engine)
    else:
        wall = time.perf_counter() - run.t0
    enabled = bool(getattr(engine, "enable_cache", True))
    tiers_after = _tier_counters(engine)
    tier_info: dict[str, Any] = {}
    if tiers_before is not None and tiers_after is not None:
        if not interrupted:
            engine.flush()  # what the run wrote to the disk tier is there when it returns
        tier_info = {
            "tiers": True,
            "host_hit_tokens": tiers_after.host_hit_tokens - tiers_before.host_hit_tokens,
            "disk_hit_tokens": tiers_after.disk_hit_tokens - tiers_before.disk_hit_tokens,
            "declined_pages": tiers_after.declined_pages - tiers_before.declined_pages,
        }
    summary = summarize(
        run.records,
        run.skipped,
        label=label or ("cache" if enabled else "no cache"),
        cache=enabled,
        mode=config.mode,
        wall_s=wall,
        interrupted=interrupted,
        **_engine_info(engine, config),
        **tier_info,
    )
    return ReplayResult(summary, tuple(run.records), tuple(run.skipped))


def _drive_sequential(run: _Run, sessions: list[TraceSession], offsets: dict[tuple[int, int], float]) -> None:
    for session, k in replay_order(sessions):
        if session.done:
            continue
        prepared = run.prepare(session, k)
        if isinstance(prepared, SkippedTurn):
            continue
        ids, options = prepared
        run.sleep_until(offsets.get((session.index, k)))
        started = time.perf_counter()
        try:
            result = run.engine.generate(ids, options.max_new_tokens, options=options)
        except CacheFullError as exc:
            run.kv_full(session, k, len(ids), exc)
            continue
        run.finish(session, k, result, started)


async def _drive_concurrent(run: _Run, sessions: list[TraceSession], offsets: dict[tuple[int, int], float]) -> None:
    """Each conversation is a task running its turns in replay order (a token session's by arrival, whatever the
    file's order); a semaphore keeps at most N in flight, which the engine's `agenerate` (the scheduler) batches."""
    gate = asyncio.Semaphore(run.config.concurrency)

    async def conversation(session: TraceSession) -> None:
        for k in sorted(range(session.turns), key=lambda k: run.positions[(session.index, k)]):
            if session.done:
                return
            offset = offsets.get((session.index, k))
            if offset is not None:
                await asyncio.sleep(max(0.0, run.t0 + offset - time.perf_counter()))
            async with gate:
                prepared = run.prepare(session, k)
                if isinstance(prepared, SkippedTurn):
                    continue  # a text conversation ends with it (session.done); a token session goes on
                ids, options = prepared
                started = time.perf_counter()
                try:
                    result = await run.engine.agenerate(ids, options.max_new_tokens, options=options)
                except CacheFullError as exc:
                    run.kv_full(session, k, len(ids), exc)
                    continue
            run.finish(session, k, result, started)

    await asyncio.gather(*(conversation(s) for s in sessions))


def _settle(engine: GenerationEngine, timeout: float = 30.0) -> None:
    """After Ctrl-C, wait until the engine's loop thread has aborted the cancelled requests and stopped (a thread
    still inside torch at interpreter exit aborts the process)."""
    try:
        engine.wait_idle(timeout)
    except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
        return


def _warm_up(engine: GenerationEngine) -> None:
    """One tiny request in its own namespace, so one-off start-up costs do not land on the first measured TTFT. An
    engine of replicas (runtime.cluster.front.ClusterEngine) sends it to each replica, past the router: a routed
    one warmed one replica, and every other's first measured request carried its start-up costs."""
    vocab = engine.config.vocab_size
    prompt = [(7 * i + 1) % vocab for i in range(8)]
    warm_each = getattr(engine, "warm_up", None)
    if warm_each is not None:
        warm_each(prompt, 2, namespace=_WARMUP_NAMESPACE)
    else:
        engine.generate(prompt, 2, namespace=_WARMUP_NAMESPACE)


def _tier_counters(engine: GenerationEngine) -> Any:
    """The engine's per-tier counters now, or None without tiers."""
    stats = getattr(engine, "stats", None)
    return getattr(stats, "tiers", None)


def _engine_info(engine: GenerationEngine, config: ReplayConfig) -> dict[str, Any]:
    cache = getattr(engine, "cache", None)
    return {
        "model": str(getattr(engine.config, "name", "")),
        "policy": str(getattr(getattr(cache, "policy", None), "name", "")),
        "page_size": int(getattr(cache, "page_size", 0) or 0),
        "capacity_blocks": int(getattr(cache, "capacity_blocks", 0) or 0),
        "concurrency": config.concurrency,
    }
