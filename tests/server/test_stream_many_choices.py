"""A stream of many choices (n up to 16, times several prompts) does O(1) work an event. Each event rescanned every
choice's task and waited on all of them anew (asyncio.wait adds and removes a callback on each): O(choices) an
event, so a 64-choice completions stream spent seconds of event-loop CPU, holding the GIL the engine's thread needs,
and took twice as long as the same answer whole.

Counted, not timed: the Python and C calls the event loop's thread makes while a stream of scripted choices (no
engine) is read, per event, stay the same for 64 choices as for 2."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.server import generation

EVENTS_PER_CHOICE = 20


class _Handle:
    request = None

    def done(self) -> bool:
        return True


def _scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Choices that each put EVENTS_PER_CHOICE events, one per loop turn, the last with a result."""

    async def submitted(_engine: Any, job: generation.Job, _inflight: Any) -> list[Any]:
        return [_Handle() for _ in range(job.choices)]

    async def one(_engine: Any, _job: Any, i: int, _handle: Any, _inflight: Any, out: asyncio.Queue, *_: Any) -> None:
        for k in range(EVENTS_PER_CHOICE):
            await asyncio.sleep(0)
            last = k == EVENTS_PER_CHOICE - 1
            await out.put(generation.Event(i, "x", result=object() if last else None))  # type: ignore[arg-type]

    monkeypatch.setattr(generation, "submit_off_loop", submitted)
    monkeypatch.setattr(generation, "_stream_one", one)


def _calls_per_event(prompts: int, n: int) -> tuple[float, list[int]]:
    job = generation.Job([[1, 2, 3]] * prompts, n, 4, RequestOptions.of(4))
    calls = 0

    def count(_frame: Any, what: str, _arg: Any) -> None:
        nonlocal calls
        calls += what in ("call", "c_call")

    async def read() -> list[int]:
        sys.setprofile(count)
        try:
            return [e.index async for e in generation.stream(None, job, generation.Inflight())]  # type: ignore[arg-type]
        finally:
            sys.setprofile(None)

    indices = asyncio.run(read())
    return calls / len(indices), indices


def test_the_work_of_an_event_does_not_grow_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch)
    few, indices = _calls_per_event(1, 2)
    assert sorted(indices) == sorted(list(range(2)) * EVENTS_PER_CHOICE)
    many, indices = _calls_per_event(4, 16)
    assert sorted(indices) == sorted(list(range(64)) * EVENTS_PER_CHOICE)  # every event of every choice, once
    # before: ~150 calls an event for 2 choices, ~400 for 64 (a scan of every task, asyncio.wait's callbacks on each)
    assert many < 2 * few, (few, many)
