"""Requests real clients send that the happy-path tests do not, on an in-process app over the tiny checkpoint:
each gets an answer in the shape its client parses (a stream stays a stream) or a 400 that names what was wrong,
and afterwards no block stays locked and the server still answers. And clients that leave mid-stream, on a real
server: their requests end at once."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.server import create_app, generation

PROMPT = list(range(1, 20))
EOS = 256  # the tiny checkpoint's <|im_end|>


pytestmark = pytest.mark.xdist_group("tiny_app")  # the shared in-process app (conftest.py)


@pytest.fixture(scope="module")
def app(tiny_app: tuple[TestClient, Engine]) -> tuple[TestClient, Engine]:
    """The tiny checkpoint (its byte-level tokenizer and ChatML template) in process, one thread (conftest.py)."""
    return tiny_app


def _settled_and_serving(client: TestClient, engine: Engine) -> None:
    """Nothing runs, queues or stays locked once idle, and a plain request is still answered."""
    deadline = time.monotonic() + 20
    while (gauges := engine.check())["running"] or gauges["waiting"]:
        assert time.monotonic() < deadline, gauges
        time.sleep(0.01)
    assert gauges["locked_blocks"] == 0, gauges
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logit_bias": {str(EOS): -100}}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text


def _events(text: str) -> list[object]:
    """An SSE body's `data:` payloads, JSON decoded ("[DONE]" kept as the string)."""
    data = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


@pytest.mark.parametrize("chat", [False, True])
def test_max_tokens_0_asked_as_a_stream_is_answered_as_a_stream(app, chat: bool) -> None:
    client, engine = app
    body = {"model": "tiny", "max_tokens": 0, "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    body |= {"messages": [{"role": "user", "content": "hello"}]} if chat else {"prompt": "hello"}
    r = client.post("/v1/chat/completions" if chat else "/v1/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    finished = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"] is not None]
    assert sorted(c["index"] for c in finished) == [0, 1] and {c["finish_reason"] for c in finished} == {"length"}
    if chat:  # OpenAI's first chunk of each choice names the role; no content ever follows
        assert [c["choices"][0]["delta"] for c in chunks if c["choices"][0]["finish_reason"] is None] == [
            {"role": "assistant", "content": ""}
        ] * 2
    else:
        assert all(c["choices"][0]["text"] == "" for c in chunks)
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 0, usage
    assert usage["usage"]["prompt_tokens"] > 0
    _settled_and_serving(client, engine)


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_0_with_a_lease_asked_says_none_was_granted(app, stream: bool) -> None:
    """usage.lease is present whenever a lease was asked for, both 0 when nothing was held: an empty completion
    holds nothing (it never reaches the engine), and its usage had no lease at all."""
    client, engine = app
    body = {"model": "tiny", "messages": [{"role": "user", "content": "lease"}], "max_tokens": 0, "stream": stream}
    for asked, want in ((20, {"seconds": 0.0, "tokens": 0}), (None, None)):
        extra = {"stream_options": {"include_usage": True}} if stream else {}
        r = client.post("/v1/chat/completions", json={**body, **extra, "retain_for": asked})
        assert r.status_code == 200, r.text
        usage = _events(r.text)[-2]["usage"] if stream else r.json()["usage"]
        assert usage.get("lease") == want, usage
    _settled_and_serving(client, engine)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", "5"),
        ("max_tokens", True),
        ("max_tokens", 5.0),
        ("n", True),
        ("seed", "7"),
        ("top_k", 2.5),
        ("temperature", "0.5"),
        ("temperature", False),
        ("stream", "yes"),
        ("stream", 1),
        ("prompt", [1.0, 2.0]),
        ("logprobs", True),
    ],
)
def test_a_field_of_the_wrong_json_type_is_a_400_naming_it(app, field: str, value: object) -> None:
    """pydantic's lax mode read "5" as 5 and true as 1: a client's mistake ran as a request it never made. OpenAI's
    API answers 400 for a field of the wrong JSON type; so does this server. An integer still stands for a number."""
    client, engine = app
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logit_bias": {str(EOS): -100}}
    r = client.post("/v1/completions", json=body | {field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split(".")[0] == field, r.text
    r = client.post("/v1/completions", json=body | {"temperature": 1, "top_p": 1, "seed": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    _settled_and_serving(client, engine)


def test_a_stream_sends_nothing_that_a_longer_stop_string_may_still_cut(app) -> None:
    """While the text was shorter than the stop strings' holdback, `text[: len(text) - holdback]` took a negative
    end and the stream sent all but its last characters, which a stop string completed later still cut: the deltas
    added up to more than the completion's text."""
    client, engine = app
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logit_bias": {str(EOS): -100}}
    full = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    stop = full[1:7]
    assert len(stop) == 6 and full.find(stop) == 1, full
    whole = client.post("/v1/completions", json=body | {"stop": stop}).json()["choices"][0]["text"]
    assert whole == full[:1]
    r = client.post("/v1/completions", json=body | {"stop": stop, "stream": True})
    chunks = [e for e in _events(r.text) if e != "[DONE]"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole, chunks
    _settled_and_serving(client, engine)


@pytest.mark.parametrize("stop", ["", [""], ["", ""]])
def test_an_empty_stop_string_stops_nothing_alone_or_in_a_list(app, stop: object) -> None:
    client, engine = app
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logit_bias": {str(EOS): -100}}
    plain = client.post("/v1/completions", json=body)
    r = client.post("/v1/completions", json=body | {"stop": stop})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
    assert r.json()["choices"][0]["finish_reason"] == "length"
    _settled_and_serving(client, engine)


@pytest.mark.parametrize("chat", [False, True])
def test_a_logit_bias_token_past_the_vocabulary_is_a_400_naming_it(app, chat: bool) -> None:
    """The engine refused it with a 400 whose `param` was null; the server now names the entry, as for any field."""
    client, engine = app
    body = {"model": "tiny", "max_tokens": 2, "logit_bias": {"5": 1, "300": 100}, "stream": chat}
    body |= {"messages": [{"role": "user", "content": "hello"}]} if chat else {"prompt": "hello"}
    r = client.post("/v1/chat/completions" if chat else "/v1/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "logit_bias.300" and "outside the vocabulary [0, 260)" in error["message"], error
    _settled_and_serving(client, engine)


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
LONE = "\ud800"  # JSON's escape spells it; no UTF-8 prompt can hold it


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": f"a{LONE}"}]}]},
            "messages.0.content.0.text",
        ),
        ({"tools": [{**TOOL, "function": {**TOOL["function"], "description": LONE}}]}, "tools.0.function.description"),
        (
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{**CALL, "function": {"name": "f", "arguments": f'{{"a": "{LONE}"}}'}}],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "r"},
                ],
                "tools": [TOOL],
            },
            "messages.1.tool_calls.0.function.arguments",
        ),
        ({"functions": [{"name": "f", "description": LONE}]}, "functions.0.description"),
    ],
)
def test_a_lone_surrogate_in_a_part_a_call_or_a_tool_is_a_400_naming_it(app, fields: dict, param: str) -> None:
    """A string field refused it by name, but one inside a content part, a call or a tool reached the tokenizer,
    whose 400 had `param` null."""
    client, engine = app
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}
    r = client.post("/v1/chat/completions", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "lone surrogate" in error["message"], error
    _settled_and_serving(client, engine)


def _nested(depth: int) -> str:
    """A JSON schema `depth` arrays deep, as raw JSON text (json.dumps would recurse as deep itself)."""
    return '{"type":"array","items":' * depth + '{"type":"string"}' + "}" * depth


CHAT_X = '"messages":[{"role":"user","content":"x"}]'


@pytest.mark.parametrize(
    ("url", "fields", "param"),
    [
        (
            "/v1/completions",
            '"prompt":"x","response_format":{"type":"json_schema","json_schema":{"schema":%s}}',
            "response_format",
        ),
        (
            "/v1/chat/completions",
            CHAT_X + ',"tools":[{"type":"function","function":{"name":"f","parameters":%s}}]',
            "tools",
        ),
        (
            "/v1/chat/completions",
            '"messages":[{"role":"user","content":[{"type":"text","text":"x","y":%s}]}]',
            "messages.0.content",
        ),
    ],
)
def test_json_nested_past_the_recursion_limit_is_a_400_naming_its_field(app, url: str, fields: str, param: str) -> None:
    """600 levels parse (the JSON decoder's own limit is about 1000) but exhausted Python's recursion limit in the
    schema and tool walkers: the request got no answer at all (a RecursionError). Now a 400 naming the field."""
    client, engine = app
    body = '{"model":"tiny","max_tokens":2,%s}' % (fields % _nested(600))
    r = client.post(url, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "nests more than 64 levels" in error["message"], error
    _settled_and_serving(client, engine)


def test_json_nested_64_levels_deep_is_served(app) -> None:
    client, engine = app
    schema = json.loads(_nested(60))  # 60 schema levels + response_format, json_schema and schema: 63 containers
    body = {"model": "tiny", "prompt": "x", "max_tokens": 2, "temperature": 0}
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].startswith("[")  # the grammar's one way to start
    _settled_and_serving(client, engine)


@pytest.mark.parametrize(
    ("method", "url", "content", "status"),
    [
        ("POST", "/v1/completions", b'{"model":"tiny","prompt":"\xff\xfe","max_tokens":2}', 400),  # not UTF-8
        ("POST", "/v1/completions", b'{"model":"tiny","prompt":"x","seed":' + b"9" * 5000 + b"}", 400),  # 5000 digits
        ("POST", "/v1/completions", b'{"model":"tiny","prompt":"x","x":' + b"[" * 2000 + b"]" * 2000 + b"}", 400),
        ("GET", "/v1/chat/completions", b"", 405),
        ("POST", "/v1/chat/completion", b"{}", 404),
    ],
    ids=["not-utf8", "5000-digits", "2000-deep", "wrong-method", "unknown-path"],
)
def test_a_body_or_route_starlette_refuses_gets_openais_error_object(app, method, url, content, status) -> None:
    """OpenAI clients read `error.message`; FastAPI's own refusals answered `{"detail": ...}` instead."""
    client, engine = app
    r = client.request(method, url, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"], error
    if status == 400:
        assert error["message"] == "We could not parse the JSON body of your request."
    if status == 405:
        assert r.headers["allow"] == "POST"
    _settled_and_serving(client, engine)


def test_a_stream_closed_while_it_waits_for_an_event_leaves_no_task_pending(app) -> None:
    """Closing the event stream (a client gone) while it waits for the next event cancelled the choices but left its
    `out.get()` task pending forever ("Task was destroyed but it is pending!" in the log)."""
    client, engine = app

    async def close_while_waiting() -> list[asyncio.Task]:
        options = RequestOptions.of(2000, caller="test", temperature=0, logit_bias={EOS: -100})
        events = generation.stream(engine, generation.Job([PROMPT], 2, 2000, options), generation.Inflight())
        await events.__anext__()
        for _ in range(100):  # catch it between two events
            waiting = asyncio.ensure_future(events.__anext__())
            await asyncio.sleep(0)
            if not waiting.done():
                break
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        await events.aclose()
        for _ in range(3):
            await asyncio.sleep(0)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]

    assert asyncio.run(close_while_waiting()) == []
    _settled_and_serving(client, engine)


def test_a_body_past_the_limit_is_a_413_before_it_is_read_whole(tiny_model_dir: Path) -> None:
    """uvicorn reads any body it is sent, and the fields' bounds apply only once it is parsed: a client posting GBs
    held that much of the server's memory. A body past max_body_bytes is now refused with OpenAI's 413, by its
    Content-Length or, sent in chunks, as soon as the bytes read pass the limit (the rest is never read)."""
    engine = Engine(str(tiny_model_dir), capacity_blocks=64, threads=1)
    with engine, TestClient(create_app(engine, "tiny", max_body_bytes=4096)) as client:
        body = {"model": "tiny", "prompt": "x" * 5000, "max_tokens": 1}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 413 and "4096 bytes" in r.json()["error"]["message"], r.text

        def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
            yield b'{"model": "tiny", "prompt": "'
            yield b"y" * 3000
            yield b"y" * 3000

        r = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["type"], r.text
        ok = client.post("/v1/completions", json=body | {"prompt": "x" * 100, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1, ok.text
        assert engine.check()["locked_blocks"] == 0
    with pytest.raises(ValueError, match="max_body_bytes"):
        create_app(engine, "tiny", max_body_bytes=0)


def _generated(server) -> float:
    return server.metrics()["radixcache_generation_tokens_total"]


async def _read_then_leave(url: str, body: dict, chunks: int) -> None:
    async with httpx.AsyncClient(timeout=60) as client, client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        seen = 0
        async for line in response.aiter_lines():
            seen += line.startswith("data: ")
            if seen == chunks:
                return  # closes the connection mid-stream


def test_a_client_gone_mid_stream_is_cancelled_without_the_garbage_collector(tiny_model_dir, launch) -> None:
    """A streaming client that goes away mid-stream: its engine request must end at once. Starlette abandons the SSE
    generator when the disconnect lands while a chunk is being sent, and the request was cancelled only once the
    garbage collector finalised that generator: with the collector off, it generated on to max_tokens in about
    half of these trials. Now the response closes its generator itself."""
    max_tokens = 3000
    with launch(tiny_model_dir, "--threads", "1", prelude="import gc; gc.disable()") as server:
        for trial in range(8):
            chat = trial % 2 == 1
            body = {"model": "tiny", "max_tokens": max_tokens, "stream": True, "temperature": 0}
            body |= {"logit_bias": {str(EOS): -100}, "n": 1 + trial % 3}
            body |= {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hello"}
            before = _generated(server)
            asyncio.run(_read_then_leave(server.v1 + ("/chat/completions" if chat else "/completions"), body, 2))
            deadline = time.monotonic() + 60
            while (gauges := httpx.get(server.url + "/health/cache", timeout=10).json())["running"]:
                assert time.monotonic() < deadline, gauges
                time.sleep(0.02)
            assert gauges["locked_blocks"] == 0, gauges
            assert _generated(server) - before < max_tokens / 3, (trial, _generated(server) - before)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br"])
def test_a_compressed_body_is_a_415_naming_its_content_encoding(server, coding: str) -> None:
    """Some HTTP clients compress request bodies when asked (requests with a gzip hook, aiohttp's `compress=`); the
    server decodes none, and answered "We could not parse the JSON body", a fault in JSON the client built right.
    A real server and httpx; the body is the compressed bytes of a valid request."""
    import gzip
    import zlib

    body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2}).encode()
    packed = gzip.compress(body) if coding == "gzip" else zlib.compress(body)  # "br": any bytes not JSON
    headers = {"content-type": "application/json"}
    r = httpx.post(
        server.v1 + "/completions", content=packed, headers={**headers, "content-encoding": coding}, timeout=60
    )
    assert r.status_code == 415, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and f"Content-Encoding: {coding}" in error["message"], error
    # the same body uncompressed, `identity` said or not, is served; the server goes on serving
    for sent in ({"content-encoding": "identity"}, {}):
        r = httpx.post(server.v1 + "/completions", content=body, headers={**headers, **sent}, timeout=60)
        assert r.status_code == 200 and len(r.json()["choices"]) == 1, r.text
    assert server.locked_blocks_settled() == 0
