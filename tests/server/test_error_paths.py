"""The server's error paths, on an in-process app over a small random-weights engine: a closed engine is 503
shutting_down; a CacheFullError is 503 kv_cache_full with Retry-After; a chat template that refuses the messages
is a 400 naming `messages`; a job the engine's queue refuses (full) is a 429 with none of its choices queued; a
choice that fails mid-stream ends the stream with OpenAI's error object and [DONE], its sibling is cancelled; a
queue timeout's Retry-After comes from the queue's recent admission wait. After each, no block stays locked and
the server still answers."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from radixcache.errors import CacheFullError
from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import QueueFullError, QueueTimeoutError
from radixcache.runtime.server import create_app, generation
from radixcache.runtime.server.errors import api_error_for
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

PROMPT = list(range(1, 20))


def _engine() -> Engine:
    m = tiny_model(seed=7)
    return Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=128)


@pytest.fixture
def app() -> Iterator[tuple[TestClient, Engine]]:
    engine = _engine()
    with TestClient(create_app(engine, "tiny")) as client:
        yield client, engine
    engine.close()


def _settled(engine: Engine) -> dict:
    deadline = time.monotonic() + 20
    while True:
        gauges = engine.check()
        if (gauges["running"] == 0 and gauges["waiting"] == 0) or time.monotonic() > deadline:
            return gauges


def _still_serves(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text


def test_a_closed_engine_is_503_shutting_down() -> None:
    engine = _engine()
    with TestClient(create_app(engine, "tiny")) as client:
        engine.close()
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "shutting_down" and r.json()["error"]["type"] == "server_error"


def test_cache_full_is_503_kv_cache_full_with_retry_after(app, monkeypatch) -> None:
    client, engine = app

    def full(*_a, **_k):
        raise CacheFullError("no room beside pinned pages")

    monkeypatch.setattr(engine, "submit", full)
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "kv_cache_full", r.text
    assert int(r.headers["retry-after"]) >= 1
    monkeypatch.undo()
    _still_serves(client)


def test_a_chat_template_refusal_is_400_naming_messages(app, monkeypatch) -> None:
    client, engine = app

    def refuse(*_a, **_k):
        raise ValueError("Conversation roles must alternate user/assistant")

    monkeypatch.setattr(engine.tokenizer, "apply_chat_template", refuse)
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "must alternate" in err["message"]
    assert _settled(engine)["locked_blocks"] == 0


def test_a_job_the_queue_refuses_is_a_429_and_queues_none_of_its_choices(app, monkeypatch) -> None:
    client, engine = app
    calls = []

    def full(prompts, *a, **k):
        calls.append(len(prompts))
        raise QueueFullError("the engine's queue is full", retry_after=3.0)

    monkeypatch.setattr(engine, "submit_group", full)
    body = {"model": "tiny", "prompt": [PROMPT, PROMPT[::-1]], "n": 2, "max_tokens": 40, "temperature": 1, "seed": 1}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
    assert r.headers["retry-after"] == "3"
    assert calls == [4]  # the whole job in one call: refused whole, nothing queued to cancel
    assert _settled(engine)["locked_blocks"] == 0 and engine.queue.waiting == 0
    monkeypatch.undo()
    _still_serves(client)


@pytest.mark.parametrize("sibling_delay", [0.0, 0.5], ids=["sibling first", "failure first"])
def test_one_choice_failing_mid_stream_ends_the_stream_and_cancels_its_sibling(
    app, monkeypatch, sibling_delay: float
) -> None:
    """Whether the sibling's first event went out before the failure or not (a busy machine: "failure first",
    forced here by holding the sibling back), the answer is 200 and the error ends the stream."""
    client, engine = app
    original, handles = generation._stream_one, []

    async def second_fails(engine_, job, i, handle, inflight, out, *rest):
        handles.append(handle)
        if i != 1:
            try:
                await asyncio.sleep(sibling_delay)
            except asyncio.CancelledError:
                inflight.cancel(handle)  # cancelled while held back: as _stream_one's own `finally` does
                raise
            return await original(engine_, job, i, handle, inflight, out, *rest)
        while len(handle.request.output_ids) < 2 and not handle.done():
            await asyncio.sleep(0.005)
        raise RuntimeError("injected detokenizer failure")

    monkeypatch.setattr(generation, "_stream_one", second_fails)
    body = {"model": "tiny", "prompt": PROMPT, "n": 2, "max_tokens": 200, "temperature": 1, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "injected" in error["message"]
    sibling = handles[0].future.result(timeout=20)
    assert sibling.finish_reason == "cancelled" or len(sibling.token_ids) < 200
    assert _settled(engine)["locked_blocks"] == 0
    monkeypatch.undo()
    _still_serves(client)


def test_queue_timeout_retry_after_comes_from_the_queue_state(app, monkeypatch) -> None:
    """The scheduler's QueueTimeoutError carries no estimate (1 s); the server asks the queue: its recent mean
    admission wait, rounded up (a waited 4.3 s on average: come back in 5)."""
    client, engine = app

    def timed_out(*_a, **_k):
        raise QueueTimeoutError("request 1 waited 2.0 s without being admitted")

    monkeypatch.setattr(engine.queue, "_mean_wait_s", 4.3)
    monkeypatch.setattr(engine, "submit", timed_out)
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "queue_timeout", r.text
    assert r.headers["retry-after"] == "5"
    assert api_error_for(QueueTimeoutError("x", retry_after=7.2)).headers["Retry-After"] == "8"


def test_a_failure_building_a_streams_usage_chunk_ends_it_with_the_error_and_done(app, monkeypatch) -> None:
    """The usage chunk (stream_options.include_usage) was built after the stream's error handling: one that failed
    cut the stream after the finish chunk, with no error object and no [DONE], the failure uncounted."""
    from radixcache.runtime.server import responses

    client, engine = app

    def broken(*_a, **_k):
        raise RuntimeError("injected usage failure")

    monkeypatch.setattr(responses, "usage", broken)
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": "tiny", "messages": messages, "max_tokens": 3, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2][len("data: ") :])["error"]
    assert "injected usage failure" in error["message"] and error["type"] == "server_error"
    finished = [json.loads(x[len("data: ") :]) for x in lines[:-2]]
    assert finished[-1]["choices"][0]["finish_reason"] is not None  # the choice's own chunks went out first
    assert _metrics_failed(client) == 1
    assert _settled(engine)["locked_blocks"] == 0
    monkeypatch.undo()
    _still_serves(client)


def _metrics_failed(client: TestClient) -> float:
    lines = client.get("/metrics").text.splitlines()
    return float(next(x for x in lines if x.startswith("radixcache_http_requests_failed_total{")).split()[-1])
