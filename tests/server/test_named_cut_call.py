"""A named tool_choice cut short by max_tokens: OpenAI returns that function's call at any max_tokens (the name is
the request's, not the model's), its `arguments` cut short (possibly no JSON) and finish_reason "length", and
streams the call's head as soon as it has it. Here a reply cut inside the call's scaffold, before the model wrote the
name, was `content: null` and no call at all, so the tokens generated were lost to the client. Now it is that call
with empty arguments; past the name, the arguments as written so far. The engine (whole and streamed), the server
(whole and streamed) and the parser of every call format agree."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.tools import ToolCallParser, assemble, normalize_tools, parse_tool_calls
from tests.server.keyed_tiny import module_tiny_server
from tests.tiny_tools import TOOLS

ASK = [{"role": "user", "content": "Add two numbers."}]
ADD = {"type": "function", "function": {"name": "add"}}
HEAD = '{"tool_calls": [{"name": "add", "arguments": '  # what the grammar has the tiny model write first


engine_fixture, client_fixture = module_tiny_server("named_cut")


def _expected(raw: str) -> list[tuple[str, str]]:
    """The call an OpenAI client expects of the raw output `raw` (a recompute from the text): named `add`, its
    arguments what follows the scaffold's `"arguments": ` (empty before it)."""
    assert (HEAD.startswith(raw) or raw.startswith(HEAD)) and raw, raw
    return [("add", raw[len(HEAD) :])]


def _pairs(calls: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


@pytest.mark.parametrize("limit", [1, 8, 20, 30, 52])
def test_the_engine_returns_the_named_call_cut_short(engine: Engine, limit: int) -> None:
    whole = engine.chat(ASK, limit, tools=TOOLS, tool_choice=ADD)
    raw = engine.tokenizer.decode(list(whole.token_ids))
    assert (whole.text, whole.finish_reason) == ("", "length")
    assert [(c.name, c.arguments) for c in whole.tool_calls] == _expected(raw)

    async def deltas() -> list[dict[str, Any]]:
        return [d async for d in engine.stream(ASK, limit, tools=TOOLS, tool_choice=ADD)]

    content, calls = assemble(asyncio.run(deltas()))
    assert (content, _pairs(calls)) == (None, _expected(raw))


@pytest.mark.parametrize("limit", [8, 52])
def test_the_server_returns_the_named_call_cut_short_whole_and_streamed(
    engine: Engine, client: TestClient, limit: int
) -> None:
    raw = engine.tokenizer.decode(list(engine.chat(ASK, limit, tools=TOOLS, tool_choice=ADD).token_ids))
    body = {"model": "tiny", "messages": ASK, "tools": TOOLS, "tool_choice": ADD, "max_tokens": limit, "temperature": 0}
    (choice,) = client.post("/v1/chat/completions", json=body).json()["choices"]
    message = choice["message"]
    assert (message["content"], choice["finish_reason"]) == (None, "length")
    assert _pairs(message["tool_calls"]) == _expected(raw)
    assert message["tool_calls"][0]["type"] == "function" and message["tool_calls"][0]["id"].startswith("call_")
    chunks = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    content, calls = assemble(deltas)
    assert (content, _pairs(calls)) == (None, _pairs(message["tool_calls"]))
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("generic", ""),
        ("generic", '{"tool_c'),
        ("generic", '{"tool_calls": [{"name": "a'),
        ("hermes", "<tool_c"),
        ("hermes", '<tool_call>\n{"na'),
        ("command_r", "Action: ```js"),
        ("command_r", 'Action: ```json\n[{"tool_name": "ad'),
        ("command_r7b", '<|START_ACTION|>[{"tool_call_id": "0", "tool'),
    ],
)
def test_every_format_makes_a_named_call_of_a_scaffold_cut_short(fmt: str, text: str) -> None:
    specs = normalize_tools(TOOLS)
    whole = parse_tool_calls(text, specs, fmt, calls_only=True, forced="add")
    assert (whole.content, [(c.name, c.arguments) for c in whole.tool_calls], whole.raw) == (None, [("add", "")], text)
    assert whole.finish_reason("length") == "length"  # "" is no JSON object: the call is not finished
    parser = ToolCallParser(specs, fmt, calls_only=True, forced="add")
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()
    assert _pairs(assemble(deltas)[1]) == [("add", "")]


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("generic", '{"tool_calls": [{"name": "add", "arguments": {"a": 2'),
        ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 2'),
        ("command_r", 'Action: ```json\n[{"tool_name": "add", "parameters": {"a": 2'),
        ("command_r7b", '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "add", "parameters": {"a": 2'),
    ],
)
def test_a_call_written_is_not_doubled_and_keeps_its_cut_arguments(fmt: str, text: str) -> None:
    specs = normalize_tools(TOOLS)
    for forced in ("add", None):
        whole = parse_tool_calls(text, specs, fmt, calls_only=True, forced=forced)
        assert [(c.name, c.arguments) for c in whole.tool_calls] == [("add", '{"a": 2')]
