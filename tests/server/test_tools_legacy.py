"""OpenAI's deprecated function calling over HTTP, on the tiny checkpoint, served as tools: `functions` and
`function_call` give `message.function_call` (no `tool_calls`) with arguments that validate and finish_reason
"function_call"; streams carry `function_call` deltas that assemble to the whole reply; a history with assistant
`function_call` and `role: "function"` turns renders as tool turns and caches the previous prompt and output in
whole pages; mixed or bad legacy fields are 400s naming them."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest

from tests.tiny_tools import TOOL_SCHEMAS, TOOLS, closed

pytestmark = pytest.mark.xdist_group("tiny_tools_server")  # the shared server (conftest.py)
FUNCTIONS = [t["function"] for t in TOOLS]
PAGE = 16
ASK = [{"role": "system", "content": "You call functions."}, {"role": "user", "content": "What is 2 + 3?"}]


def _ask(tools_client, messages: list[dict[str, Any]] = ASK, **kw: Any) -> Any:
    kw = {"model": "tiny", "messages": messages, "functions": FUNCTIONS, "max_tokens": 160, **kw}
    return tools_client.chat.completions.create(**kw)


def _valid(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), closed(TOOL_SCHEMAS[name]))


def test_a_named_function_call_is_answered_in_the_legacy_shape(tools_client) -> None:
    for seed in range(3):
        r = _ask(tools_client, function_call={"name": "add"}, temperature=1.0, seed=seed)
        choice = r.choices[0]
        assert choice.finish_reason == "function_call" and choice.message.tool_calls is None, choice
        assert choice.message.content is None and choice.message.function_call.name == "add"
        _valid("add", choice.message.function_call.arguments)


def test_none_calls_nothing_and_auto_answers_text_or_one_call(tools_client) -> None:
    r = _ask(tools_client, function_call="none", max_tokens=6, temperature=0)
    assert r.choices[0].message.function_call is None and r.choices[0].finish_reason in ("stop", "length")
    for seed in range(2):
        message = _ask(tools_client, max_tokens=12, temperature=1.0, seed=seed).choices[0].message
        assert message.tool_calls is None
        if message.function_call is not None:
            _valid(message.function_call.name, message.function_call.arguments)


def test_a_stream_carries_function_call_deltas_that_assemble_to_the_whole_reply(
    tools_client, tiny_tools_server
) -> None:
    whole = _ask(tools_client, function_call={"name": "get_weather"}, temperature=0).choices[0].message.function_call
    body = {
        "model": "tiny",
        "messages": ASK,
        "functions": FUNCTIONS,
        "function_call": {"name": "get_weather"},
        "temperature": 0,
    }
    with httpx.stream(
        "POST", tiny_tools_server.v1 + "/chat/completions", json={**body, "max_tokens": 160, "stream": True}
    ) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    deltas = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert deltas[0]["delta"] == {"role": "assistant", "content": None}  # as OpenAI's when the reply may be calls
    assert deltas[1]["delta"] == {"function_call": {"name": "get_weather", "arguments": ""}}
    pieces = [d["delta"]["function_call"] for d in deltas[2:-1]]
    assert all(set(p) == {"arguments"} for p in pieces) and pieces
    assert deltas[-1]["finish_reason"] == "function_call" and deltas[-1]["delta"] == {}
    assert "".join(p["arguments"] for p in pieces) == whole.arguments
    _valid("get_weather", whole.arguments)


def test_a_legacy_history_renders_as_tool_turns_and_hits_the_previous_turn(tools_client) -> None:
    messages = [{"role": "system", "content": "You call functions (history)."}, *ASK[1:]]
    previous = None
    for step in range(3):
        r = _ask(tools_client, messages, function_call={"name": "add"}, temperature=0.9, seed=step)
        call = r.choices[0].message.function_call
        _valid(call.name, call.arguments)
        if previous is not None:  # the replayed call is the model's very text: its pages are cached
            assert r.usage.prompt_tokens_details.cached_tokens >= (previous - 1) // PAGE * PAGE, (step, r.usage)
        previous = r.usage.prompt_tokens + r.usage.completion_tokens
        messages.append({"role": "assistant", "content": None, "function_call": call.model_dump()})
        messages.append({"role": "function", "name": call.name, "content": f"{step + 5}"})


def test_a_call_repeated_with_the_same_arguments_keeps_each_turns_id_and_the_cache(tools_client) -> None:
    """An agent polling one function with the same arguments: each replayed call keeps the id its turn was answered
    with, so the history renders as before (the id is in the tool result's line) and every turn hits the whole
    previous prompt and output; a later turn's id given to the earlier calls changed the prompt there."""
    now = {"name": "now", "parameters": {"type": "object", "properties": {"tz": {"type": "string", "enum": ["UTC"]}}}}
    messages = [{"role": "system", "content": "You poll the clock."}, {"role": "user", "content": "Time?"}]
    previous, calls = None, set()
    for step in range(4):
        r = _ask(tools_client, messages, functions=[now], function_call={"name": "now"}, temperature=0)
        call = r.choices[0].message.function_call
        calls.add((call.name, call.arguments))
        if previous is not None:
            assert r.usage.prompt_tokens_details.cached_tokens >= (previous - 1) // PAGE * PAGE, (step, r.usage)
        previous = r.usage.prompt_tokens + r.usage.completion_tokens
        messages.append({"role": "assistant", "content": None, "function_call": call.model_dump()})
        messages.append({"role": "function", "name": "now", "content": f"12:0{step}"})
    assert len(calls) == 1  # the same call every turn (greedy, one allowed value): the case this is about


def test_a_history_with_calls_the_server_never_made_keeps_a_stable_prefix(tools_client) -> None:
    made_up = {"role": "assistant", "content": None, "function_call": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}
    history = [*ASK, made_up, {"role": "function", "name": "add", "content": "2"}]
    first = _ask(tools_client, history, function_call="none", max_tokens=2, temperature=0)
    longer = [*history, {"role": "user", "content": "And 4 + 4?"}]
    second = _ask(tools_client, longer, function_call="none", max_tokens=2, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= (first.usage.prompt_tokens - PAGE) // PAGE * PAGE


OK = [{"role": "user", "content": "hi"}]
BAD = [
    ({"functions": FUNCTIONS, "tools": TOOLS}, "functions"),
    ({"function_call": "auto", "tool_choice": "auto", "tools": TOOLS}, "function_call"),
    ({"functions": FUNCTIONS, "parallel_tool_calls": True}, "functions"),
    ({"functions": [{"name": "bad name"}]}, "functions.0.name"),
    (
        {"functions": [{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integr"}}}}]},
        "functions.0.parameters.properties.x.type",
    ),
    ({"functions": [FUNCTIONS[0], FUNCTIONS[0]]}, "functions.1.name"),
    ({"functions": 3}, "functions"),
    ({"functions": FUNCTIONS, "function_call": {"name": "nope"}}, "function_call.name"),
    # no name: the 400 asked for the tool field's shape, {"type": "function", "function": {...}}, refused here too
    ({"functions": FUNCTIONS, "function_call": {}}, "function_call.name"),
    ({"functions": FUNCTIONS, "function_call": {"type": "function", "function": {"name": "a"}}}, "function_call.name"),
    ({"functions": FUNCTIONS, "function_call": "required"}, "function_call"),
    ({"function_call": "auto"}, "function_call"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages.0.name"),
    (
        {"messages": [{"role": "user", "content": "x", "function_call": {"name": "a", "arguments": "{}"}}]},
        "messages.0.function_call",
    ),
    (
        {
            "messages": [
                *OK,
                {
                    "role": "assistant",
                    "content": None,
                    "function_call": {"name": "add"},
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
                },
            ]
        },
        "messages.1.function_call",
    ),
    (
        {"messages": [*OK, {"role": "assistant", "content": None, "function_call": {"name": 5}}]},
        "messages.1.function_call",
    ),
    (
        {
            "messages": [
                *OK,
                {"role": "assistant", "content": None, "function_call": {"name": "add", "arguments": 5}},
            ]
        },
        "messages.1.function_call",  # arguments text is taken as written, JSON or not; a number is no text
    ),
]


@pytest.mark.parametrize(("body", "param"), BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)])
def test_bad_legacy_bodies_are_400_naming_the_field_and_a_bystander_is_served(tiny_tools_server, body, param) -> None:
    r = httpx.post(
        tiny_tools_server.v1 + "/chat/completions",
        json={"model": "tiny", "messages": OK, "max_tokens": 2, **body},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
    assert '"function": {' not in r.json()["error"]["message"], r.json()  # nothing of the tool fields' shape
    ok = httpx.post(
        tiny_tools_server.v1 + "/chat/completions", json={"model": "tiny", "messages": OK, "max_tokens": 2}, timeout=60
    )
    assert ok.status_code == 200
