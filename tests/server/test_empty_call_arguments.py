"""A history's call without parameters whose arguments are "" (or whitespace, or null): OpenRouter's models write
that for a call without parameters and clients replay it (Continue, agno, autogen each patched their own json.loads
for it; vLLM's chat preprocessing did too). It was a 400, "is not valid JSON", on every later turn of the
conversation, in the chat, legacy and Responses forms. It is no arguments: the prompt is the one the same history
with "{}" gives (the independent expectation), and a call the model wrote as {} still renders as its own text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.tools import ToolCallMemory, normalize_tools, parse_tool_calls
from tests.tiny_tools import TOOLS

ASK = {"role": "user", "content": "What time is it?"}
EMPTY = ["", "  ", "\n", None]


def history(arguments: Any) -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": arguments}}
    return [
        ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    from tests.cli.conftest import write_tiny_checkpoint

    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("empty_arguments") / "tiny")
    with Engine(str(directory), capacity_blocks=256, page_size=16, dtype="float64", threads=1) as engine:
        yield engine


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, "tiny")) as c:
        yield c


@pytest.mark.parametrize("arguments", EMPTY)
def test_empty_arguments_render_as_no_arguments(engine: Engine, arguments: Any) -> None:
    tiny_tokenizer = engine.tokenizer
    specs = normalize_tools(TOOLS)
    want = tiny_tokenizer.apply_chat_template(history("{}"), tools=specs)
    assert tiny_tokenizer.apply_chat_template(history(arguments), tools=specs) == want
    memory = ToolCallMemory()
    output = '{"tool_calls": [{"name": "now", "arguments": {}}]}'  # the model's own text, remembered
    (call,) = parse_tool_calls(output, specs, new_id=lambda: "call_1").tool_calls
    memory.remember([call], output)
    assert output in tiny_tokenizer.apply_chat_template(history(arguments), tools=specs, tool_memory=memory)


@pytest.mark.parametrize("arguments", EMPTY)
def test_the_server_takes_them_in_every_form(client: TestClient, arguments: Any) -> None:
    def prompt_tokens(body: dict[str, Any], path: str = "/v1/chat/completions") -> int:
        reply = client.post(path, json={"model": "tiny", **body})
        assert reply.status_code == 200, reply.text
        usage = reply.json()["usage"]
        return usage.get("prompt_tokens", usage.get("input_tokens"))

    chat = {"tools": TOOLS, "max_tokens": 1}
    assert prompt_tokens({**chat, "messages": history(arguments)}) == prompt_tokens({**chat, "messages": history("{}")})

    def legacy(args: Any) -> dict[str, Any]:
        call = {"role": "assistant", "content": None, "function_call": {"name": "now", "arguments": args}}
        result = {"role": "function", "name": "now", "content": "12:00"}
        return {"messages": [ASK, call, result], "functions": [t["function"] for t in TOOLS], "max_tokens": 1}

    assert prompt_tokens(legacy(arguments)) == prompt_tokens(legacy("{}"))

    def responses(args: Any) -> dict[str, Any]:
        call = {"type": "function_call", "call_id": "call_1", "name": "now", "arguments": args}
        output = {"type": "function_call_output", "call_id": "call_1", "output": "12:00"}
        tools = [{"type": "function", **t["function"]} for t in TOOLS]
        return {"input": [ASK, call, output], "tools": tools, "max_output_tokens": 1}

    if arguments is not None:  # the Responses item's arguments are a string
        assert prompt_tokens(responses(arguments), "/v1/responses") == prompt_tokens(responses("{}"), "/v1/responses")
