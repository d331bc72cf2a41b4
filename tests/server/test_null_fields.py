"""A field sent as null is the field left out, where OpenAI's spec makes it nullable with a default (`temperature`,
`top_p`, `n`, `presence_penalty`, `frequency_penalty`, `stream`, `echo`; this server's `top_k`, `min_p`,
`repetition_penalty` likewise): the openai package sends an argument given as None (`temperature=None`, as a
framework passes its unset settings along) as null, and each was a 400 ("Input should be a valid number"). The
answer with the null equals the answer without the field (seeded sampling); a required field's null, and an unknown
field's, are still refused by name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

COMMON = ("temperature", "top_p", "n", "presence_penalty", "frequency_penalty", "stream", "top_k", "min_p")
COMMON += ("repetition_penalty",)
BODIES = {
    "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6},
    "/v1/completions": {"model": "tiny", "prompt": "hello", "max_tokens": 6},
    "/v1/responses": {"model": "tiny", "input": "hello", "max_output_tokens": 6, "store": False},
}
FIELDS = {"/v1/chat/completions": COMMON, "/v1/completions": (*COMMON, "echo"), "/v1/responses": ("stream",)}


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    m = tiny_model(seed=4)
    with Engine(RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size)), capacity_blocks=64) as e:
        yield e


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, "tiny")) as c:
        yield c


def _answer(client: TestClient, path: str, body: dict[str, Any]) -> Any:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    if path == "/v1/responses":
        return [item["content"] for item in out["output"]]
    return [c.get("text", c.get("message")) for c in out["choices"]]


@pytest.mark.parametrize(("path", "field"), [(p, f) for p, fields in FIELDS.items() for f in fields])
def test_a_nullable_field_sent_as_null_is_the_field_left_out(client: TestClient, path: str, field: str) -> None:
    body = {**BODIES[path], "seed": 7}
    assert _answer(client, path, {**body, field: None}) == _answer(client, path, body)


@pytest.mark.parametrize("field", ["model", "messages", "no_such_field"])
def test_a_required_or_unknown_field_sent_as_null_is_still_refused(client: TestClient, field: str) -> None:
    r = client.post("/v1/chat/completions", json={**BODIES["/v1/chat/completions"], field: None})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


# the sampling fields both paths take: null over HTTP, None in Python (Engine.generate / chat keywords)
SAMPLING_NULLS = ("top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed")
SAMPLING_NULLS += ("stop", "logit_bias")


def test_null_over_http_and_none_in_python_give_the_same_output(client: TestClient, engine: Engine) -> None:
    """An agent framework's unset settings reach the engine either way: as null through the openai package, or as
    None through the Python API. Both are the field's default, so the greedy output is the same. The one default
    that differs is temperature's: OpenAI's null is 1.0 over HTTP, the Python API's None its own 0.0 (greedy)."""
    nones = dict.fromkeys(SAMPLING_NULLS)
    messages = [{"role": "user", "content": "hello"}]
    chat = {**BODIES["/v1/chat/completions"], **nones, "temperature": 0.0}
    want = engine.chat(messages, 6, temperature=None, **nones).text
    assert _answer(client, "/v1/chat/completions", chat)[0]["content"] == want
    completion = {**BODIES["/v1/completions"], **nones, "temperature": 0.0}
    want = engine.generate("hello", 6, temperature=None, **nones).text
    assert _answer(client, "/v1/completions", completion) == [want]
    sampled = {**completion, "temperature": None, "seed": 11}  # null: OpenAI's 1.0
    want = engine.generate("hello", 6, **{**nones, "temperature": 1.0, "seed": 11}).text
    assert _answer(client, "/v1/completions", sampled) == [want]
