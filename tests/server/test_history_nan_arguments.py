"""A client's history whose call arguments hold NaN or Infinity (Python's json.dumps writes them, json.loads reads
them; RFC 8259 JSON has neither): they went into the prompt as written, where the model's own calls with NaN are
refused everywhere (no call; a Responses follow-up drops them). The docs say arguments are a JSON object or its
text, so such a history is a 400 naming the call's arguments, in the chat, legacy and Responses forms alike."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server import create_app
from radixcache.runtime.tools import ToolInputError, normalize_messages
from tests.tiny_tools import TOOLS

ASK = {"role": "user", "content": "Weather?"}
BAD = ['{"city": NaN}', '{"city": "Paris", "days": [1, Infinity]}', '{"t": -Infinity}']


def history(arguments: Any) -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "21"}
    return [ASK, {"role": "assistant", "content": None, "tool_calls": [call]}, result]


@pytest.mark.parametrize("arguments", [*BAD, {"city": float("nan")}, {"t": [float("inf")]}])
def test_a_historys_arguments_must_be_json(arguments: Any) -> None:
    if isinstance(arguments, str):  # the independent check: Python reads it, a strict JSON reader does not
        json.loads(arguments)
        with pytest.raises(ValueError):
            json.loads(arguments, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    with pytest.raises(ToolInputError) as e:
        normalize_messages(history(arguments))
    assert e.value.path == "messages[1].tool_calls[0].function.arguments"
    assert "not valid JSON" in str(e.value)


def test_json_arguments_still_read() -> None:
    (_, assistant, _) = normalize_messages(history('{"city": "Paris", "n": 1e400, "x": -0.0}'))
    assert assistant.tool_calls[0].arguments == '{"city": "Paris", "n": 1e400, "x": -0.0}'  # as written


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    from tests.cli.conftest import write_tiny_checkpoint

    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("nan_history") / "tiny")
    engine = Engine(str(directory), capacity_blocks=64, page_size=16, dtype="float64", threads=1)
    with TestClient(create_app(engine, "tiny")) as c:
        yield c
    engine.close()


@pytest.mark.parametrize("arguments", BAD)
def test_the_server_refuses_them_naming_the_call(client: TestClient, arguments: str) -> None:
    chat = client.post(
        "/v1/chat/completions", json={"model": "tiny", "messages": history(arguments), "tools": TOOLS, "max_tokens": 1}
    )
    call = {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": arguments}}
    legacy = {
        "model": "tiny",
        "messages": [ASK, call, {"role": "function", "name": "get_weather", "content": "21"}],
        "functions": [t["function"] for t in TOOLS],
        "max_tokens": 1,
    }
    old = client.post("/v1/chat/completions", json=legacy)
    item = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": arguments}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "21"}
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    responses = client.post(
        "/v1/responses", json={"model": "tiny", "input": [ASK, item, output], "tools": tools, "max_output_tokens": 1}
    )
    for reply, param in [
        (chat, "messages.1.tool_calls.0.function.arguments"),
        (old, "messages.1.function_call.arguments"),
        (responses, "input.1.arguments"),
    ]:
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["param"], "not valid JSON" in error["message"]) == (param, True), error


@pytest.mark.parametrize("arguments", ['{"city": "Paris",}', "[1]", '{"city": NaN}'])
def test_a_legacy_function_calls_arguments_are_named_as_sent(client: TestClient, arguments: str) -> None:
    """A legacy `function_call` becomes a tool call before the history is read: its bad arguments were named
    `messages.1.tool_calls.0.function.arguments`, a field the client never sent."""
    call = {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": arguments}}
    body = {
        "model": "tiny",
        "messages": [ASK, call, {"role": "function", "name": "get_weather", "content": "21"}],
        "functions": [t["function"] for t in TOOLS],
        "max_tokens": 1,
    }
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "messages.1.function_call.arguments"
    assert reply.json()["error"]["message"].startswith("messages[1].function_call.arguments: ")
