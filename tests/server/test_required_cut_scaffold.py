"""tool_choice "required" (or a named function) runs under a grammar of the calls alone, and a reply the length
limit cut inside the `{"tool_calls": [` scaffold, before any call's name, was returned as that fragment in
`content` (`"{\"to"`, finish_reason "length"). OpenAI returns no content for a required call, and a cut before any
name is no call (docs/tool_calls.md): content null, no calls, "length", in the engine and over HTTP, whole and
streamed alike. Under a named function the name is the request's: that call, its arguments empty
(tests/server/test_named_cut_call.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.tools import assemble, normalize_tools, parse_tool_calls
from tests.server.keyed_tiny import module_tiny_server
from tests.tiny_tools import TOOLS

ASK = [{"role": "user", "content": "What time is it?"}]
SCAFFOLD = '{"tool_calls": [{"name": "'
NAMED = {"type": "function", "function": {"name": "now"}}


engine_fixture, client_fixture = module_tiny_server("required_cut")


@pytest.mark.parametrize("choice", ["required", NAMED])
@pytest.mark.parametrize("limit", [1, 4, 17])
def test_the_engine_returns_no_content_for_a_scaffold_cut_short(engine: Engine, choice: Any, limit: int) -> None:
    whole = engine.chat(ASK, limit, tools=TOOLS, tool_choice=choice)
    raw = engine.tokenizer.decode(list(whole.token_ids))
    assert SCAFFOLD.startswith(raw) and raw, raw  # the independent expectation: cut before any name
    named = [("now", "")] if choice == NAMED else []  # a named function's name is the request's
    assert (whole.text, whole.finish_reason) == ("", "length")
    assert [(c.name, c.arguments) for c in whole.tool_calls] == named

    async def deltas() -> list[dict[str, Any]]:
        return [d async for d in engine.stream(ASK, limit, tools=TOOLS, tool_choice=choice)]

    content, calls = assemble(asyncio.run(deltas()))
    assert (content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls]) == (None, named)


@pytest.mark.parametrize("limit", [4, 17])
def test_the_server_returns_no_content_for_a_scaffold_cut_short(client: TestClient, limit: int) -> None:
    body = {"model": "tiny", "messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": limit}
    (choice,) = client.post("/v1/chat/completions", json=body).json()["choices"]
    assert choice["message"]["content"] is None and not choice["message"].get("tool_calls")
    assert choice["finish_reason"] == "length"
    chunks = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert assemble(deltas) == (None, [])
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    responses = {"model": "tiny", "input": ASK, "tools": [{"type": "function", **TOOLS[2]["function"]}]}
    out = client.post("/v1/responses", json={**responses, "tool_choice": "required", "max_output_tokens": limit})
    assert [item["type"] for item in out.json()["output"]] in ([], ["message"])
    texts = [p.get("text") for item in out.json()["output"] for p in item.get("content", [])]
    assert not any(texts), out.json()


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("generic", '{"tool_c'),
        ("generic", '{"tool_calls": [{"na'),
        ("hermes", "<tool_c"),
        ("hermes", '<tool_call>\n{"n'),
    ],
)
def test_a_parser_of_calls_alone_gives_no_content(fmt: str, text: str) -> None:
    specs = normalize_tools(TOOLS)
    assert parse_tool_calls(text, specs, fmt).content == text  # under "auto", the model's text
    cut = parse_tool_calls(text, specs, fmt, calls_only=True)
    assert (cut.content, cut.tool_calls, cut.raw) == (None, (), text)
    later = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n<tool_ca'
    assert parse_tool_calls(later, specs, "hermes", calls_only=True).content is None
