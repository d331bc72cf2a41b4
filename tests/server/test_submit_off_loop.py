"""Building a request (its grammar compiled, its prompt checked) and rendering a chat run off the server's event
loop: while one request's build takes half a second, /health and another client's completion are answered; and a
request whose client goes away while its build runs is cancelled once it is built, leaving no page locked.
In-process app over the tiny random model, with the engine's `submit` slowed on purpose."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.server import create_app, generation
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

SLOW_S = 0.5
BODY = {"model": "tiny", "prompt": list(range(1, 20)), "max_tokens": 4, "temperature": 0}


@pytest.fixture
def engine() -> Any:
    m = tiny_model(seed=3)
    with Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=64) as e:
        yield e
        assert e.check()["locked_blocks"] == 0


def _slow_first_submit(engine: Engine, monkeypatch: pytest.MonkeyPatch, made: list[Any]) -> threading.Event:
    """The next `submit` sleeps SLOW_S first (a big grammar's compile); returns an event set when it starts. Every
    handle submitted is appended to `made`."""
    started, real = threading.Event(), engine.submit
    slowed = [False]

    def submit(*args: Any, **kwargs: Any) -> Any:
        if not slowed[0]:
            slowed[0] = True
            started.set()
            time.sleep(SLOW_S)
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(engine, "submit", submit)
    return started


def test_the_event_loop_answers_others_while_a_request_is_built(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = _slow_first_submit(engine, monkeypatch, [])
    with TestClient(create_app(engine, "tiny")) as client:
        slow: list[Any] = []
        sender = threading.Thread(target=lambda: slow.append(client.post("/v1/completions", json=BODY)))
        sender.start()
        assert started.wait(30)
        t0 = time.perf_counter()
        assert client.get("/health").status_code == 200
        other = client.post("/v1/completions", json={**BODY, "prompt": list(range(30, 40))})
        waited = time.perf_counter() - t0
        sender.join(60)
        assert other.status_code == 200 and slow[0].status_code == 200, (other.text, slow[0].text)
        assert other.json()["usage"]["completion_tokens"] == 4
        # Had the build blocked the loop, both would have waited for its SLOW_S; a loaded machine may still be slow,
        # so the bound is the one thing that separates the two: the slow build had not ended.
        assert waited < SLOW_S, waited


def test_a_request_cancelled_while_it_is_built_is_cancelled_once_built(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Any] = []
    started = _slow_first_submit(engine, monkeypatch, made)
    job = generation.Job([list(range(1, 30))], 1, 200, RequestOptions.of(200, caller="test"))
    inflight = generation.Inflight()

    async def cancel_mid_build() -> None:
        task = asyncio.create_task(generation.complete(engine, job, inflight))
        while not started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert inflight.cancelled == 0  # nothing built yet
        deadline = time.monotonic() + 30
        while inflight.cancelled == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the build ends; its handle is cancelled by the done callback, on this loop

    asyncio.run(cancel_mid_build())
    assert inflight.cancelled == 1
    (handle,) = made
    result = handle.result(30)  # the engine stopped it early, not after its 200 tokens
    assert result.finish_reason == "cancelled" and len(result.token_ids) < 200, result
    assert engine.wait_idle(30)
