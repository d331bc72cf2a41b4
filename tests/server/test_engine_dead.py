"""A server whose engine loop thread died (a bug outside every per-request guard) answers 503 `engine_dead` for the
request in flight, for every later request, streamed or not, and for /health/cache: the engine is unavailable,
which is not this request's fault (it was a 500 before). In-process app over the tiny random model."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import EngineDeadError
from radixcache.runtime.server import create_app
from radixcache.runtime.server.errors import api_error_for
from radixcache.runtime.testing import CharTokenizer, RandomModel, hold_engine_loop, tiny_model

BODY = {"model": "tiny", "prompt": list(range(1, 20)), "max_tokens": 5, "temperature": 0}


def _assert_engine_dead(response: Any) -> None:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "engine_dead", error
    assert "the loop broke" in error["message"] and "retry-after" not in response.headers


def test_engine_dead_maps_to_503_engine_dead() -> None:
    error = api_error_for(EngineDeadError(RuntimeError("x")))
    assert (error.status, error.type, error.code, error.headers) == (503, "server_error", "engine_dead", {})


def test_a_dead_engine_loop_is_503_engine_dead_for_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    m = tiny_model(seed=7)
    engine = Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=64)
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))  # the expected death
    try:
        with TestClient(create_app(engine, "tiny")) as client:
            assert client.post("/v1/completions", json=BODY).status_code == 200
            release = hold_engine_loop(engine)
            in_flight: list[Any] = []
            sender = threading.Thread(target=lambda: in_flight.append(client.post("/v1/completions", json=BODY)))
            sender.start()
            while not engine._loop._inbox:  # the request reached the engine and waits behind the hold
                time.sleep(0.005)

            def broken(_done: Any) -> None:  # a bug in the loop itself, outside every per-request guard
                raise RuntimeError("the loop broke")

            monkeypatch.setattr(engine._loop, "_deliver", broken)
            release()
            sender.join(30)
            assert not sender.is_alive()
            for thread in threading.enumerate():  # let it finish dying within this test
                if thread.name == "radixcache-engine":
                    thread.join(30)
            assert [str(e) for e in died] == ["the loop broke"]
            _assert_engine_dead(in_flight[0])  # queued before the death: failed with EngineDeadError by it
            _assert_engine_dead(client.post("/v1/completions", json=BODY))
            _assert_engine_dead(client.post("/v1/completions", json={**BODY, "stream": True}))
            chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            _assert_engine_dead(client.post("/v1/chat/completions", json=chat))
            _assert_engine_dead(client.get("/health/cache"))
            assert client.get("/health").status_code == 200  # the process answers; its engine does not
    finally:
        monkeypatch.undo()
        engine.close()
