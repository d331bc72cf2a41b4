"""Hostile schemas over HTTP, on an in-process app over the tiny checkpoint: a schema too large to compile (an enum
of 100,000 strings, 10,000 properties) is a 400 whose `param` names the part that holds its bulk, for
response_format and for a tool's parameters alike, sent before anything is queued; the replies that are served
validate (json.loads, jsonschema); afterwards nothing stays locked and a plain request is served."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.grammar import schema_check

EOS = 256  # the tiny checkpoint's <|im_end|>
ENUM = [f"value number {i}" for i in range(100_000)]
MANY = {f"p{i}": {"type": "integer"} for i in range(10_000)}


pytestmark = pytest.mark.xdist_group("tiny_app")  # the shared in-process app (conftest.py)


@pytest.fixture(scope="module")
def app(tiny_app: tuple[TestClient, Engine]) -> tuple[TestClient, Engine]:
    """The tiny checkpoint in process, one thread (conftest.py)."""
    return tiny_app


def _settled_and_serving(client: TestClient, engine: Engine) -> None:
    deadline = time.monotonic() + 20
    while (gauges := engine.check())["running"] or gauges["waiting"]:
        assert time.monotonic() < deadline, gauges
        time.sleep(0.01)
    assert gauges["locked_blocks"] == 0, gauges
    body = {"model": "tiny", "prompt": "x", "max_tokens": 3, "temperature": 0, "logit_bias": {str(EOS): -100}}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text


def _chat(client: TestClient, **fields: Any) -> Any:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, **fields}
    return client.post("/v1/chat/completions", json=body)


def _schema_format(schema: Any, strict: bool = True) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}


@pytest.mark.parametrize(
    ("schema", "param"),
    [
        ({"type": "object", "properties": {"a": {"enum": ENUM}}}, "properties.a.enum"),
        ({"type": "object", "properties": MANY, "required": ["p0"]}, "properties"),
    ],
)
@pytest.mark.parametrize("strict", [True, False])
def test_a_schema_too_large_to_compile_is_a_400_naming_its_bulk(app, schema: Any, param: str, strict: bool) -> None:
    client, engine = app
    r = _chat(client, response_format=_schema_format(schema, strict))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == f"response_format.json_schema.schema.{param}", error
    assert "at most 262,144" in error["message"], error
    _settled_and_serving(client, engine)


@pytest.mark.parametrize(
    ("schema", "param", "reason"),
    [
        ({"type": "number", "multipleOf": 1e-300}, "multipleOf", "too many digits"),
        (
            {"allOf": [{"type": "object", "properties": {f"p{i}": {"type": "integer"}}} for i in range(1_000)]},
            "allOf",
            "schema too large",
        ),
    ],
)
def test_a_refused_keyword_is_a_400_naming_it(app, schema: Any, param: str, reason: str) -> None:
    """The param was the schema's root (`response_format.json_schema.schema`), not the keyword the library refused."""
    client, engine = app
    r = _chat(client, response_format=_schema_format(schema))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == f"response_format.json_schema.schema.{param}" and reason in error["message"], error
    _settled_and_serving(client, engine)


def test_a_tools_parameters_too_large_are_a_400_naming_them(app) -> None:
    client, engine = app
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": MANY}}}
    for choice in ("auto", "required"):
        r = _chat(client, tools=[tool], tool_choice=choice)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "tools.0.function.parameters.properties", r.text
    _settled_and_serving(client, engine)


def test_a_large_schema_under_the_bound_is_served_and_validates(app) -> None:
    client, engine = app
    schema = {"type": "object", "properties": {"a": {"enum": ENUM[:5_000]}}, "required": ["a"]}
    for strict in (True, False):
        r = _chat(client, response_format=_schema_format(schema, strict), temperature=1.0, seed=3, max_tokens=60)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    _settled_and_serving(client, engine)


def test_a_lone_surrogate_in_a_schemas_key_is_a_400_naming_it(app) -> None:
    """The error body naming the key could not be encoded: the 400 said "'utf-8' codec can't encode character"
    with no param. The key is escaped in the param (JSON's own escape, as text)."""
    client, engine = app
    rf = _schema_format({"type": "object", "properties": {"\ud800": {"type": "string"}}})
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "response_format": rf}
    content = json.dumps(body)  # the key as JSON's escape "\ud800"
    r = client.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_format.json_schema.schema.properties.\\ud800", r.text
    _settled_and_serving(client, engine)


def _ref_chain(links: int) -> dict[str, Any]:
    """`$defs` each an object holding the next as a property: shallow JSON, 2 levels a link once followed."""
    defs = {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(links)}
    return {
        "$defs": {**defs, f"d{links}": {"type": "integer"}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/d0"}},
    }


def test_constraints_that_crashed_the_process_are_400s(app) -> None:
    """A chain of 1,000 `$ref`s (~90 KB) and an EBNF grammar's `%json` const of -2**63 + 1 or 3,000 chained rules
    each crashed the server (a segfault in the library's compile), the grammars nested beside tool calls too
    (tool_choice "auto"); each is a 400 naming its field, and the server goes on serving."""
    client, engine = app
    tool = {"type": "function", "function": {"name": "f", "parameters": _ref_chain(1_000)}}
    rules = "start: a0\n" + "".join(f"a{i}: a{i + 1}\n" for i in range(3_000)) + 'a3000: "y"\n'
    const = 'start: %json {"type": "integer", "const": -9223372036854775807}'
    plain = {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {}}}}
    sent = [
        (
            {"response_format": _schema_format(_ref_chain(1_000))},
            "response_format.json_schema.schema.properties.a.$ref",
        ),
        ({"tools": [tool], "tool_choice": "required"}, "tools.0.function.parameters.properties.a.$ref"),
        ({"grammar": const}, "grammar"),
        ({"grammar": rules}, "grammar"),
        ({"grammar": const, "tools": [plain], "tool_choice": "auto"}, "grammar"),
        ({"grammar": rules, "tools": [plain], "tool_choice": "auto"}, "grammar"),
    ]
    for fields, param in sent:
        r = _chat(client, **fields)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.text
    _settled_and_serving(client, engine)


def test_a_regex_that_expands_past_the_bound_is_a_400_naming_its_field(app) -> None:
    """`(a{1000}){1000}` cost seconds of a worker thread before the library refused it, and a schema's
    `"pattern": "^a{1000000}$"` was named by the schema's root: each is a 400 naming its own field, from the size
    check (its words), and the server goes on serving."""
    client, engine = app
    pattern = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a{1000000}$"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": pattern}}
    sent = [
        ({"regex": "(a{1000}){1000}"}, "regex"),
        ({"response_format": _schema_format(pattern)}, "response_format.json_schema.schema.properties.s.pattern"),
        ({"tools": [tool], "tool_choice": "required"}, "tools.0.function.parameters.properties.s.pattern"),
    ]
    for fields, param in sent:
        r = _chat(client, **fields)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.text
        assert "expands to more than 10,000 parts" in r.json()["error"]["message"], r.text
    _settled_and_serving(client, engine)


def test_a_grammar_whose_parser_gives_up_on_its_first_token_is_a_400(app) -> None:
    """`("a"~2..4){200}` compiled, then failed the request at its first token after its prefill (the library's
    parser past its items following the ways its repetitions split the text): a 400 naming `grammar` before
    anything is queued, and the server goes on serving."""
    client, engine = app
    r = _chat(client, grammar='start: ("a"~2..4){200}')
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "grammar" and "gives up on its first token" in error["message"], error
    _settled_and_serving(client, engine)


def test_schemas_and_tools_are_checked_off_the_event_loop(app, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks of a schema, of a grammar and of the tools' parameters are linear in their size: a 260 KB schema's
    took ~0.5 s, on the event loop, where every stream and /health stalled that long (measured: /health took 451 ms
    while such a body was refused, 51 ms at most idle). They run in a worker thread, for chat, completions and the
    Responses API alike; each check here records whether an event loop runs in its thread."""
    client, engine = app
    in_loop: list[bool] = []
    check = schema_check.check_size

    def recorded(schema: Any, path: str) -> None:
        try:
            asyncio.get_running_loop()
            in_loop.append(True)
        except RuntimeError:
            in_loop.append(False)
        check(schema, path)

    monkeypatch.setattr(schema_check, "check_size", recorded)
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    sent = [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "response_format": _schema_format(schema)},
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}),
        ("/v1/completions", {"prompt": "hi", "response_format": _schema_format(schema)}),
        ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}}),
    ]
    for route, fields in sent:
        in_loop.clear()
        tokens = "max_output_tokens" if route == "/v1/responses" else "max_tokens"
        r = client.post(route, json={"model": "tiny", tokens: 16, **fields})
        assert r.status_code == 200, r.text
        assert in_loop and not any(in_loop), (route, in_loop)
    _settled_and_serving(client, engine)


def test_a_grammar_that_gives_up_past_the_compiles_probe_is_a_clear_error_whole_or_streamed(app) -> None:
    """A grammar whose parser gives up past the compile's few tokens (behind 8 free ones) fails its request where it
    gives up: whole, a 400 naming `grammar` in the compile's words; streamed, the deltas before it, then an error
    event naming `grammar`, then `[DONE]`; the server goes on serving."""
    client, engine = app
    grammar = 'start: ("x" | "y"){8} ("a"+){1000}'
    r = _chat(client, grammar=grammar)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "grammar" and "parser gives up" in error["message"], error
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json={**body, "grammar": grammar}) as s:
        events = [line.removeprefix("data: ") for line in s.iter_lines() if line]
    assert s.status_code == 200 and events[-1] == "[DONE]", events
    *deltas, failure = [json.loads(e) for e in events[:-1]]
    written = "".join(d["choices"][0]["delta"].get("content") or "" for d in deltas)
    assert set(written) <= {"x", "y"} and len(written) <= 8, written
    assert failure["error"]["param"] == "grammar" and "parser gives up" in failure["error"]["message"], failure
    _settled_and_serving(client, engine)
