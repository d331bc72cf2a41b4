"""A shutdown past its grace period (`--shutdown-timeout`) aborts the requests still running, and each ends in
OpenAI's shape: a whole response is a 503 `shutting_down`, a stream ends with that error event and `[DONE]` (a
Responses stream with `error` and `response.failed`), and the process exits 0 without a traceback. Before, a
cancelled request read as finished (finish_reason "stop"), and uvicorn's own timeout cut every stream off mid-body
("incomplete chunked read") and logged a traceback per request."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from typing import Any

import httpx
import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import EngineClosedError
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.server import generation
from radixcache.runtime.testing import CharTokenizer, RandomModel, hold_engine_loop, tiny_model

LONG = 3000  # tokens: far more than the tiny model writes in the test's fraction of a second


@pytest.fixture
def engine() -> Any:
    m = tiny_model(seed=3)
    with Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=512) as e:
        yield e
        assert e.wait_idle(30)
        assert e.check()["locked_blocks"] == 0


def _job(n: int = 1) -> generation.Job:
    options = RequestOptions.of(LONG, caller="test", ignore_eos=True)
    return generation.Job([list(range(1, 40))], n, LONG, options)


def test_an_aborted_stream_raises_shutting_down_and_a_new_request_is_refused(engine: Engine) -> None:
    inflight = generation.Inflight()

    async def run() -> list[Any]:
        events = generation.stream(engine, _job(n=2), inflight)
        seen = [await events.__anext__()]
        release = hold_engine_loop(engine)  # the requests cannot end by themselves before the abort
        assert inflight.abort() == 2
        release()
        with pytest.raises(EngineClosedError):
            async for event in events:
                assert event.result is None, "an aborted choice ended as if finished"
                seen.append(event)
        with pytest.raises(EngineClosedError):  # nothing starts once the server aborted
            await generation.complete(engine, _job(), inflight)
        return seen

    asyncio.run(run())
    # The stream raised at its first aborted choice; the other's future completes on the engine's loop thread (the
    # done callback forgets its handle), maybe a little later on a loaded machine.
    assert engine.wait_idle(30)
    assert not inflight.handles


def test_an_aborted_whole_request_raises_shutting_down(engine: Engine) -> None:
    inflight = generation.Inflight()

    async def run() -> None:
        task = asyncio.ensure_future(generation.complete(engine, _job(n=3), inflight))
        deadline = time.monotonic() + 30
        while len(inflight.handles) < 3 and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert len(inflight.handles) == 3, "the three choices never ran"
        release = hold_engine_loop(engine)
        inflight.abort()
        release()
        with pytest.raises(EngineClosedError):
            await task

    asyncio.run(run())


@pytest.mark.slow
def test_sigterm_past_the_shutdown_timeout_ends_streams_with_an_error_event(tiny_model_dir, launch) -> None:
    no_eos = {"logit_bias": {"256": -100}, "max_tokens": 4000}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "go on"}], "n": 8, "stream": True, **no_eos}
    whole = {"model": "tiny", "prompt": "and on", "n": 8, **no_eos}
    responses = {
        "model": "tiny",
        "input": "more",
        "stream": True,
        "max_output_tokens": 4000,
        "logit_bias": {"256": -100},
    }
    with launch(tiny_model_dir, "--capacity-blocks", "2048", "--shutdown-timeout", "0.5") as s:
        out: dict[str, Any] = {}

        def post_whole() -> None:
            out["whole"] = httpx.post(s.v1 + "/completions", json=whole, timeout=60)

        sender = threading.Thread(target=post_whole)
        sender.start()
        with (
            httpx.stream("POST", s.v1 + "/chat/completions", json=chat, timeout=60) as r,
            httpx.stream("POST", s.v1 + "/responses", json=responses, timeout=60) as rr,
        ):
            lines, rlines = r.iter_lines(), rr.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
            assert next(line for line in rlines if line.startswith("data: {"))
            deadline = time.monotonic() + 60
            while _in_engine(s.url) < 17:  # the 8 chat choices, the response, and the 8 whole choices
                assert time.monotonic() < deadline, "the 17 choices never ran together"
                time.sleep(0.05)
            s.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]  # read to the end: no "incomplete chunked read"
            rrest = [line for line in rlines if line.startswith("data: ")]
        sender.join(60)
        assert s.proc.wait(timeout=30) == 0
        output = s.proc.stdout.read()
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2].removeprefix("data: "))["error"]
    assert error["code"] == "shutting_down", rest[-2]
    finishes = [c["finish_reason"] for line in rest[:-2] for c in json.loads(line[6:])["choices"]]
    assert set(finishes) == {None}, "an aborted choice ended as if finished"
    kinds = [json.loads(line[6:])["type"] for line in rrest]
    assert kinds[-2:] == ["error", "response.failed"], kinds[-3:]
    assert out["whole"].status_code == 503 and out["whole"].json()["error"]["code"] == "shutting_down"
    assert "Traceback" not in output and "server stopped" in output, output


def _in_engine(url: str) -> int:
    cache = httpx.get(url + "/health/cache", timeout=30).json()
    return cache["running"] + cache["waiting"]
