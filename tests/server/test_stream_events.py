"""In-process checks of the streaming path's edges (no server process): a request that fails before its first
token sends no event before its error, so the HTTP layer can still answer with a status; a failure after the
first token becomes an OpenAI error event followed by `data: [DONE]`."""

from __future__ import annotations

import asyncio
import json

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import QueueTimeoutError
from radixcache.runtime.engine.loop import RequestHandle
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.server import generation
from radixcache.runtime.server.metrics import ServerMetrics
from radixcache.runtime.server.responses import Responder
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model


@pytest.fixture(scope="module")
def engine() -> Engine:
    m = tiny_model(seed=3)
    return Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=32)


def test_a_request_dropped_before_its_first_token_sends_no_event_before_the_error(engine: Engine) -> None:
    async def run() -> list:
        req = engine._request([5, 6, 7], 4)
        handle = RequestHandle(None, req)  # type: ignore[arg-type]
        job = generation.Job([[5, 6, 7]], 1, 4, RequestOptions.of(4))
        out: asyncio.Queue = asyncio.Queue()
        task = asyncio.create_task(generation._stream_one(engine, job, 0, handle, generation.Inflight(), out))
        await asyncio.sleep(0)
        req.listener(req)  # the scheduler tells the listener first (the request left) ...
        await asyncio.sleep(0.01)
        handle.future.set_exception(QueueTimeoutError("waited too long"))  # ... then the loop fails its future
        with pytest.raises(QueueTimeoutError):
            await task
        return [out.get_nowait() for _ in range(out.qsize())]

    assert asyncio.run(run()) == []


def test_a_failure_after_the_first_token_is_an_error_event_then_done() -> None:
    async def events():
        yield generation.Event(0, "Hel")
        raise RuntimeError("the pass failed")

    async def run() -> list[str]:
        responder = Responder("chat.completion", "tiny", 3)
        return [chunk async for chunk in responder.sse(events(), False, ServerMetrics())]

    chunks = asyncio.run(run())
    assert chunks[-1] == "data: [DONE]\n\n"
    error = json.loads(chunks[-2][len("data: ") :])["error"]
    assert error["type"] == "server_error" and "the pass failed" in error["message"]
    assert json.loads(chunks[1][len("data: ") :])["choices"][0]["delta"]["content"] == "Hel"
