"""OpenAI's chat fields that change no answer on this server are accepted as OpenAI accepts them, not refused as
unknown (an OpenAI client or agent framework that sets them got a 400 "Unrecognized request argument"):
`prompt_cache_key` (OpenAI's key for requests that share a prefix) is the request's session, ahead of `user` and
the X-Session-Id header; `safety_identifier`, `store`, `service_tier`, `modalities: ["text"]` and
`prompt_cache_retention: "in_memory"` (accepted on /v1/responses, "Unrecognized" here before) are accepted;
values OpenAI would refuse, or that ask for what this server cannot do (audio out), are a 400 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "temperature": 0}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, list[str | None]]]:
    m = tiny_model(seed=4)
    engine = Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=64)
    sessions: list[str | None] = []
    submit = engine.submit

    def recording_submit(*args: Any, **kwargs: Any) -> Any:
        sessions.append(kwargs["options"].session)
        return submit(*args, **kwargs)

    monkeypatch.setattr(engine, "submit", recording_submit)
    with TestClient(create_app(engine, "tiny")) as client:
        yield client, sessions
    engine.check()
    engine.close()


@pytest.mark.parametrize(
    ("fields", "headers", "session"),
    [
        ({"prompt_cache_key": "conv-1"}, {}, "conv-1"),
        ({"prompt_cache_key": "conv-1", "user": "alice"}, {"X-Session-Id": "h"}, "conv-1"),
        ({"user": "alice"}, {"X-Session-Id": "h"}, "alice"),
        ({}, {"X-Session-Id": "h"}, "h"),
        ({}, {}, None),
    ],
)
def test_prompt_cache_key_is_the_session_ahead_of_user_and_the_header(
    served, fields: dict[str, str], headers: dict[str, str], session: str | None
) -> None:
    client, sessions = served
    for endpoint, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"model": "tiny", "prompt": "hi"})):
        r = client.post(endpoint, json={**body, **fields}, headers=headers)
        assert r.status_code == 200, r.text
        assert sessions.pop() == session


def test_openai_fields_that_change_no_answer_are_accepted_and_change_none(served) -> None:
    client, _ = served
    plain = client.post("/v1/chat/completions", json=CHAT)
    assert plain.status_code == 200, plain.text
    extra = {"store": False, "service_tier": "auto", "safety_identifier": "user-7f3", "modalities": ["text"]}
    extra["prompt_cache_retention"] = "in_memory"
    for name, value in extra.items():
        r = client.post("/v1/chat/completions", json={**CHAT, name: value})
        assert r.status_code == 200, (name, r.text)
        assert r.json()["choices"] == plain.json()["choices"], name


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("modalities", ["text", "audio"]),
        ("modalities", ["audio"]),
        ("service_tier", "fastest"),
        ("store", "no"),
        ("prompt_cache_key", "k" * 257),
        ("prompt_cache_key", 7),
        ("safety_identifier", ["x"]),
        ("prompt_cache_retention", "24h"),  # as /v1/responses refuses it: nothing here keeps a prefix a day
        ("prompt_cache_retention", "forever"),
    ],
)
def test_values_openai_refuses_or_this_server_cannot_serve_are_a_400_naming_the_field(
    served, name: str, value: object
) -> None:
    client, sessions = served
    r = client.post("/v1/chat/completions", json={**CHAT, name: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split(".")[0] == name, r.json()
    assert sessions == []  # refused before anything reached the engine
