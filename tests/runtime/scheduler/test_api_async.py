"""The asyncio side of the Python API: why a stream ended, and the event loop kept free of slow request building."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.testing import CharTokenizer, RandomModel, hold_engine_loop

from .conftest import assert_clean


def test_a_stream_says_why_it_ended_finished_cut_by_close_or_timed_out(tiny: RandomModel) -> None:
    """A stream cut by close() or its timeout ended like one that finished: nothing told its reader why. Its
    `result` is the request's GenerationResult and `finish_reason` says why, as generate's results do."""
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    want = engine.generate("stream me", 12, ignore_eos=True)

    async def read(**kw: object) -> tuple[str, object]:
        s = engine.stream("stream me", 12, ignore_eos=True, **kw)
        assert s.result is None and s.finish_reason is None
        return "".join([d async for d in s]), s

    text, s = asyncio.run(read())
    assert text == want.text and s.finish_reason == "length" and s.result.token_ids == want.token_ids
    _, s = asyncio.run(read(timeout=1e-9))  # past its deadline at the first step
    assert s.finish_reason == "timeout" and s.result.token_ids == ()
    assert_clean(engine)

    async def cut_by_close() -> tuple[str, object]:
        s = engine.stream("go on and on", 400, ignore_eos=True)
        shown = ""
        async for d in s:
            shown += d
            if engine.close() is not None and len(shown) > 400:  # close() cancels it at once
                raise AssertionError("the stream went on after close()")
        return shown, s

    shown, s = asyncio.run(cut_by_close())
    assert s.finish_reason == "cancelled" and s.result.text == shown and 0 < len(s.result.token_ids) < 400


class GatedTokenizer(CharTokenizer):
    """Encodes a prompt holding "slow" only once `release` is set (as a long prompt or a first grammar takes a
    while); `entered` is set as it starts waiting. `waited_out`: the gate was never opened within 20 s, which
    happens only if whoever opens it could not run meanwhile (an event loop the encode blocked)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()
        self.waited_out = False

    def encode(self, text: str) -> list[int]:
        if "slow" in text:
            self.entered.set()
            self.waited_out = not self.release.wait(20)
        return super().encode(text)


@pytest.mark.parametrize("call", ["agenerate", "achat", "stream"])
def test_a_slow_tokenise_leaves_the_callers_event_loop_free(tiny: RandomModel, call: str) -> None:
    """agenerate, achat and stream tokenised (and compiled grammars) on the caller's event loop: every other
    coroutine stood still meanwhile (about 0.4 s for SmolLM2's first grammar). The work runs on a worker thread."""
    tok = GatedTokenizer()
    engine = Engine(RandomModel(tiny.config, tiny.weights, tok), capacity_blocks=128, page_size=4)
    tok.release.set()  # the reference is not held
    want = engine.generate("a slow prompt", 6, ignore_eos=True)
    tok.entered.clear()
    tok.release.clear()

    async def job() -> str:
        if call == "agenerate":
            return (await engine.agenerate("a slow prompt", 6, ignore_eos=True)).text
        if call == "achat":
            return (await engine.achat([{"role": "user", "content": "slow"}], 6, ignore_eos=True)).text
        return "".join([d async for d in engine.stream("a slow prompt", 6, ignore_eos=True)])

    async def main() -> str:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticking = asyncio.create_task(ticker())
        task = asyncio.create_task(job())
        await asyncio.to_thread(tok.entered.wait, 30)
        seen = ticks
        while ticks < seen + 10:  # the loop runs other coroutines while the encode waits
            await asyncio.sleep(0)
        tok.release.set()
        text = await task
        ticking.cancel()
        return text

    text = asyncio.run(main())
    assert not tok.waited_out, "the event loop stood still while the prompt was tokenised"
    if call != "achat":
        assert text == want.text
    engine.close()
    assert_clean(engine)


def test_cancelling_an_agenerate_while_its_prompt_is_built_cancels_the_request(tiny: RandomModel) -> None:
    """Building the request off the event loop: a task cancelled meanwhile must not leave its request running."""
    tok = GatedTokenizer()
    engine = Engine(RandomModel(tiny.config, tiny.weights, tok), capacity_blocks=128, page_size=4)

    async def main() -> None:
        task = asyncio.create_task(engine.agenerate("a slow prompt", 400, ignore_eos=True))
        await asyncio.to_thread(tok.entered.wait, 30)
        task.cancel()
        await asyncio.sleep(0)
        tok.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    release = hold_engine_loop(engine)  # the request, queued by the worker thread, cannot run a step before its cancel
    asyncio.run(main())  # its end waits for the worker thread, which queued the request and then cancelled it
    release()
    assert engine.wait_idle(60)
    assert engine.stats.generated_tokens == 0
    assert_clean(engine)


@pytest.mark.parametrize("tools", [False, True], ids=["text", "tool-deltas"])
def test_breaking_out_of_a_stream_cancels_its_request_without_a_garbage_collection(
    tiny: RandomModel, tools: bool
) -> None:
    """A reader that broke out of `async for delta in engine.stream(...)` left its request decoding to its
    max_new_tokens, its pages locked: the stream and its deltas' generator held each other, so only a full garbage
    collection (or the event loop's end) closed the generator. With the collector off, dropping the iterator now
    cancels the request: the next command finds nothing running and nothing locked."""
    engine = Engine(tiny, capacity_blocks=128, page_size=4)
    kw = {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]} if tools else {}

    async def break_early() -> dict[str, int]:
        async for delta in engine.stream("go on and on", 10_000, ignore_eos=True, **kw):
            assert isinstance(delta, dict if tools else str)  # OpenAI's delta dicts with tools
            break
        for _ in range(20):  # the event loop's turns that run the dropped generator's aclose
            await asyncio.sleep(0)
        return await asyncio.to_thread(engine.check)  # a command queued after the cancel

    gc.disable()
    try:
        gauges = asyncio.run(break_early())
    finally:
        gc.enable()
    assert gauges["running"] == gauges["waiting"] == gauges["locked_blocks"] == 0
    assert_clean(engine)
    engine.close()
