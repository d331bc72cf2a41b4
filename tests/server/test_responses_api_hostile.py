"""Hostile values on OpenAI's Responses API (`POST /v1/responses`) over HTTP, on the tiny checkpoint's shared
server: each is a 400 naming the Responses field (never the chat endpoint's it is translated to), whole or streamed,
and nothing refused is stored or breaks a stored response (lone surrogates, an item id sent twice)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.server.test_responses_api import FLAT, _post

pytestmark = pytest.mark.xdist_group("tiny_tools_server")  # the shared server (conftest.py)


HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"bogus": 1}, "bogus"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": "0.5"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": 1 << 40}, "max_output_tokens"),
    ({"max_output_tokens": 100_000}, "max_output_tokens"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input.0.role"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type"),
    ({"input": [{"type": "function_call_output", "call_id": "c" * 257, "output": "x"}]}, "input.0.call_id"),
    ({"input": [{"type": "function_call", "call_id": "c" * 257, "name": "add", "arguments": "{}"}]}, "input.0.call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0"),
    ({"input": [{"role": "user", "content": "x", "colour": 1}]}, "input.0.colour"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "add", "arguments": 5}]}, "input.0.arguments"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0.call_id"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools.0.function"),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"x": {"type": "nope"}}},
                }
            ]
        },
        "tools.0.parameters.properties.x.type",
    ),
    ({"tools": FLAT, "tool_choice": {"type": "function", "name": "missing"}}, "tool_choice.name"),
    ({"tools": FLAT, "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    (
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "bogus"}}}},
        "text.format.schema.type",
    ),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    # a schema beside json_object or text constrained nothing while its caller believed it did (a 200)
    (
        {"text": {"format": {"type": "json_object", "schema": {"type": "object", "required": ["a"]}}}},
        "text.format.schema",
    ),
    ({"text": {"format": {"type": "text", "name": "x", "schema": {"type": "object"}}}}, "text.format.name"),
    ({"text": {"format": {"type": "json_object", "strict": True}}}, "text.format.strict"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"truncation": "auto"}, "truncation"),
    ({"background": True}, "background"),
    ({"include": ["message.output_text.logprobs"]}, "include.0"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"metadata": {"k": "v" * 600}}, "metadata.k"),
    ({"seed": 1 << 64}, "seed"),
    ({"cache_salt": ""}, "cache_salt"),
]


@pytest.mark.parametrize(("fields", "param"), HOSTILE, ids=[p for _, p in HOSTILE])
def test_hostile_values_are_400_naming_the_field(tiny_tools_server, fields: dict[str, Any], param: str) -> None:
    r = _post(tiny_tools_server, {"input": "hi", "max_output_tokens": 2, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


@pytest.mark.parametrize("stream", [False, True])
def test_a_400_names_the_responses_field_in_its_param_and_message(tiny_tools_server, stream: bool) -> None:
    """Also for what the engine refuses once the job is submitted (a schema no text satisfies), and in the message
    of the chat path's checks (which name `messages[2].tool_calls[0]...`)."""
    unsatisfiable = {"type": "string", "minLength": 5, "maxLength": 2}
    call = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": ["not", "text"]}
    cases = [
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": unsatisfiable}}}, "text.format.schema"),
        ({"instructions": "sys", "input": [{"role": "user", "content": "q"}, call]}, "input.1.arguments"),
        ({"tools": FLAT + FLAT[:1]}, f"tools.{len(FLAT)}.name"),
        # a named choice without its name: the chat path's shape, {"function": {"name"}}, was what the 400 asked
        # for, which this endpoint then refused as an unknown field
        ({"tools": FLAT, "tool_choice": {"type": "function"}}, "tool_choice.name"),
        ({"tools": FLAT, "tool_choice": {"type": "function", "name": 5}}, "tool_choice.name"),
    ]
    for fields, param in cases:
        r = _post(tiny_tools_server, {"input": "hi", "max_output_tokens": 2, "stream": stream, **fields})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and error["message"].startswith(f"{param}: "), error
        assert '"function": {' not in error["message"], error  # nothing of the chat body's shape


def test_a_lone_surrogate_in_what_is_stored_or_echoed_is_a_400_and_never_breaks_a_stored_response(
    tiny_tools_server,
) -> None:
    """JSON's escapes spell a lone surrogate, which no UTF-8 answer holds: an item's id or call_id (stored, listed
    by input_items), a schema's key or a tool's description (echoed in the response) holding one is refused up
    front, by its path (a tool's was refused by the tokenizer, with no param)."""
    lone = "\ud800"
    call = {"type": "function_call", "call_id": f"c{lone}", "name": "add", "arguments": "{}"}
    schema = {"type": "object", "properties": {lone: {"type": "integer"}}}
    cases = [
        ({"input": [{"role": "user", "content": "q", "id": f"msg_{lone}"}]}, "input.0.id"),
        ({"input": [{"role": "user", "content": "q"}, call]}, "input.1.call_id"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}}, "text.format.schema.properties"),
        ({"tools": [{"type": "function", "name": "f", "description": f"d{lone}"}]}, "tools.0.description"),
    ]
    for stream in (False, True):
        for fields, param in cases:
            body = {"model": "tiny", "input": "hi", "max_output_tokens": 2, "stream": stream, **fields}
            r = httpx.post(
                tiny_tools_server.v1 + "/responses",
                content=json.dumps(body),  # ASCII: the surrogate as its escape
                headers={"content-type": "application/json"},
                timeout=60,
            )
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == param and "lone surrogate" in r.json()["error"]["message"]


def test_an_item_id_sent_twice_in_a_conversation_is_a_400_as_openais_duplicate_item(
    tools_client, tiny_tools_server
) -> None:
    """input_items pages by id: a repeated id would send a client's `after` back to its first copy forever."""
    twice = [{"role": "user", "content": "a", "id": "msg_a"}, {"role": "user", "content": "b", "id": "msg_a"}]
    r = _post(tiny_tools_server, {"input": twice, "max_output_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input.1.id", r.text
    first = tools_client.responses.create(model="tiny", input=twice[:1], max_output_tokens=2)
    (reply,) = first.output
    again = [reply.model_dump(), {"role": "user", "content": "more"}]  # the previous output sent back
    r = _post(tiny_tools_server, {"input": again, "previous_response_id": first.id, "max_output_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input.0.id", r.text
    r = _post(tiny_tools_server, {"input": twice[:1], "previous_response_id": first.id, "max_output_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input.0.id", r.text
    follow = tools_client.responses.create(
        model="tiny", input="more", previous_response_id=first.id, max_output_tokens=2
    )
    listed = list(tools_client.responses.input_items.list(follow.id, order="asc", limit=1))  # pages of one
    assert [i.id for i in listed][:2] == ["msg_a", reply.id] and len({i.id for i in listed}) == len(listed) == 3
