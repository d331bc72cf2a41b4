"""A client's history whose call arguments hold NaN or Infinity (Python's json.dumps writes them, json.loads reads
them; RFC 8259 JSON has neither). Arguments text is kept as written, JSON or not (a call cut by the length limit
replays, as OpenAI takes any string): `{"city": NaN}` is such text, never read as a number, in the chat, legacy and
Responses forms alike. An arguments object holding NaN (the Python API) has no text to keep: it is refused, naming
the call's arguments."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime.tools import ToolInputError, normalize_messages
from tests.server.keyed_tiny import tiny_client
from tests.tiny_tools import TOOLS

ASK = {"role": "user", "content": "Weather?"}
BAD = ['{"city": NaN}', '{"city": "Paris", "days": [1, Infinity]}', '{"t": -Infinity}']


def history(arguments: Any) -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "21"}
    return [ASK, {"role": "assistant", "content": None, "tool_calls": [call]}, result]


@pytest.mark.parametrize("arguments", [{"city": float("nan")}, {"t": [float("inf")]}])
def test_an_arguments_object_holding_nan_is_refused(arguments: Any) -> None:
    with pytest.raises(ToolInputError) as e:
        normalize_messages(history(arguments))
    assert e.value.path == "messages[1].tool_calls[0].function.arguments"
    assert "not valid JSON" in str(e.value)


@pytest.mark.parametrize("arguments", BAD)
def test_arguments_text_holding_nan_is_kept_as_written(arguments: str) -> None:
    json.loads(arguments)  # Python reads it; a strict JSON reader does not
    with pytest.raises(ValueError):
        json.loads(arguments, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    (_, assistant, _) = normalize_messages(history(arguments))
    assert assistant.tool_calls[0].arguments == arguments


def test_json_arguments_still_read() -> None:
    (_, assistant, _) = normalize_messages(history('{"city": "Paris", "n": 1e400, "x": -0.0}'))
    assert assistant.tool_calls[0].arguments == '{"city": "Paris", "n": 1e400, "x": -0.0}'  # as written


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with tiny_client(tmp_path_factory, "nan_history") as c:
        yield c


@pytest.mark.parametrize("arguments", [*BAD, '{"city": "Paris",}', "[1]"])
def test_the_server_takes_them_in_every_form(client: TestClient, arguments: str) -> None:
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
    for reply in (chat, old, responses):
        assert reply.status_code == 200, reply.text
