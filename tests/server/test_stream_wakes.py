"""A stream of many choices wakes the event loop once for all the choices an engine step told, not once per choice:
each request's listener made its own `call_soon_threadsafe`, so a 64-choice stream's engine thread woke the loop 64
times a step (a write to its self-pipe each, and a GIL hand-over to the loop thread).

Counted, not timed: scripted steps, each telling every choice's listener of one new token in one go (as the engine's
thread does), cost one loop wake each, and every choice's text still arrives whole."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.server import generation
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

CHOICES, STEPS = 64, 12
TEXT = "hello world!"  # choice i is sent TEXT, one character a step


class _Handle:
    def __init__(self, req: Any) -> None:
        self.request = req
        self.future: Future[Any] = Future()

    def done(self) -> bool:
        return self.future.done()

    def cancel(self) -> None:
        pass


@pytest.fixture(scope="module")
def engine() -> Engine:
    m = tiny_model(seed=3)
    return Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=32)


def test_one_loop_wake_per_step_for_all_the_choices(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = engine.tokenizer.encode(TEXT)
    assert len(tokens) == STEPS
    handles = [_Handle(engine._request([5, 6, 7], STEPS)) for _ in range(CHOICES)]

    async def submitted(_engine: Any, _job: Any, _inflight: Any) -> list[Any]:
        return handles

    monkeypatch.setattr(generation, "submit_off_loop", submitted)
    job = generation.Job([[5, 6, 7]] * 4, CHOICES // 4, STEPS, RequestOptions.of(STEPS))

    async def run() -> tuple[list[int], dict[int, str]]:
        loop = asyncio.get_running_loop()
        wakes, threadsafe = [], loop.call_soon_threadsafe

        def counted(*args: Any) -> Any:
            wakes[-1] += 1
            return threadsafe(*args)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        texts: dict[int, str] = {}

        async def read() -> None:
            async for e in generation.stream(engine, job, generation.Inflight()):  # type: ignore[arg-type]
                texts[e.index] = texts.get(e.index, "") + e.text

        reader = asyncio.create_task(read())
        for _ in range(5):  # the stream submits and starts its choices
            await asyncio.sleep(0)
        for token in tokens:  # one engine step: every choice's listener in one go, on the "engine thread"
            wakes.append(0)
            for h in handles:
                h.request.output_ids.append(token)
                h.request.listener(h.request)
            for _ in range(5):  # the loop delivers, the choices read
                await asyncio.sleep(0)
        wakes.append(0)
        for h in handles:
            ids = list(h.request.output_ids)
            h.future.set_result(SimpleNamespace(text=TEXT, token_ids=ids, logprobs=None, finish_reason="length"))
        await reader
        return wakes[:-1], texts

    wakes, texts = asyncio.run(run())
    assert texts == {i: TEXT for i in range(CHOICES)}
    assert wakes == [1] * STEPS  # before: [64] * STEPS


def test_every_mark_after_the_loop_closed_raises() -> None:
    """A reader gone (its loop closed): every choice's listener raises, as `call_soon_threadsafe` did, so the
    scheduler drops each and fails its request, not only the first choice's."""
    loop = asyncio.new_event_loop()
    wakes = generation.Wakes(loop, 3)
    wakes.mark(0)  # a call scheduled, never run
    loop.close()
    for i in range(3):
        with pytest.raises(RuntimeError, match="closed"):
            wakes.mark(i)
