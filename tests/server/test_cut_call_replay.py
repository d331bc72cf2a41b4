"""A call the length limit cut, replayed by a client as received (LangChain and the openai SDK send the assistant
message back as they got it): its arguments are no JSON (`{"city": "P`), which the history check refused, so every
later turn of the conversation was a 400, where OpenAI takes any string there. Arguments text is rendered as
written, in the chat, legacy function_call and Responses forms alike: the conversation goes on, and its prompt
extends the previous prompt and output (the cache serves their pages)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.server.keyed_tiny import tiny_client
from tests.tiny_tools import TOOLS

PAGE = 4
ASK = {"role": "user", "content": "Weather in Paris?"}
AGAIN = {"role": "user", "content": "Go on."}
LIMIT = 60  # the forced call is one token a character: cut inside the arguments


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with tiny_client(tmp_path_factory, "cut_replay", page_size=PAGE) as c:
        yield c


def not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


def extends(first: dict[str, Any], second: dict[str, Any], prompt: str, output: str) -> None:
    """`second`'s prompt extends `first`'s prompt and output: the cache serves their whole pages."""
    assert second[prompt] > first[prompt] + first[output]
    cached = second[f"{prompt}_details"]["cached_tokens"]
    assert cached >= (first[prompt] + first[output] - 1) // PAGE * PAGE, (first, second)


def test_a_chat_call_cut_by_the_limit_replays(client: TestClient) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = {"model": "tiny", "tools": TOOLS[:1], "tool_choice": named, "temperature": 0}
    first = client.post("/v1/chat/completions", json={**body, "messages": [ASK], "max_tokens": LIMIT}).json()
    (choice,) = first["choices"]
    assert choice["finish_reason"] == "length" and not_json(choice["message"]["tool_calls"][0]["function"]["arguments"])
    again = {**body, "tool_choice": "none", "messages": [ASK, choice["message"], AGAIN], "max_tokens": 1}
    second = client.post("/v1/chat/completions", json=again)
    assert second.status_code == 200, second.text
    extends(first["usage"], second.json()["usage"], "prompt_tokens", "completion_tokens")


def test_a_legacy_function_call_cut_by_the_limit_replays(client: TestClient) -> None:
    body = {"model": "tiny", "functions": [TOOLS[0]["function"]], "temperature": 0}
    body["function_call"] = {"name": "get_weather"}
    first = client.post("/v1/chat/completions", json={**body, "messages": [ASK], "max_tokens": LIMIT}).json()
    message = first["choices"][0]["message"]
    assert not_json(message["function_call"]["arguments"]), message
    again = {**body, "function_call": "none", "messages": [ASK, message, AGAIN], "max_tokens": 1}
    second = client.post("/v1/chat/completions", json=again)
    assert second.status_code == 200, second.text
    extends(first["usage"], second.json()["usage"], "prompt_tokens", "completion_tokens")


def test_a_responses_call_cut_by_the_limit_replays(client: TestClient) -> None:
    tools = [{"type": "function", **t["function"]} for t in TOOLS[:1]]
    body = {"model": "tiny", "tools": tools, "temperature": 0, "store": False}
    named = {"type": "function", "name": "get_weather"}
    first = client.post(
        "/v1/responses", json={**body, "tool_choice": named, "input": [ASK], "max_output_tokens": LIMIT}
    ).json()
    (call,) = first["output"]
    assert call["type"] == "function_call" and not_json(call["arguments"]), call
    again = {**body, "tool_choice": "none", "input": [ASK, call, AGAIN], "max_output_tokens": 16}
    second = client.post("/v1/responses", json=again)
    assert second.status_code == 200, second.text
    extends(first["usage"], second.json()["usage"], "input_tokens", "output_tokens")


@pytest.mark.parametrize("limit", [LIMIT, 42])  # 42: cut after the call's name (arguments "")
def test_a_responses_call_cut_by_the_limit_is_kept_by_previous_response_id(client: TestClient, limit: int) -> None:
    """A follow-up by previous_response_id dropped the cut call from its history: its prompt lacked what the model
    wrote, and the cache missed the reply's pages. The call is replayed as written."""
    tools = [{"type": "function", **t["function"]} for t in TOOLS[:1]]
    body = {"model": "tiny", "tools": tools, "temperature": 0}
    named = {"type": "function", "name": "get_weather"}
    first = client.post(
        "/v1/responses", json={**body, "tool_choice": named, "input": [ASK], "max_output_tokens": limit}
    ).json()
    (call,) = first["output"]
    assert call["type"] == "function_call" and call["status"] == "incomplete", call
    assert (call["arguments"] == "") == (limit == 42), call
    follow = {**body, "tool_choice": "none", "previous_response_id": first["id"], "input": [AGAIN]}
    second = client.post("/v1/responses", json={**follow, "max_output_tokens": 1})
    assert second.status_code == 200, second.text
    extends(first["usage"], second.json()["usage"], "input_tokens", "output_tokens")


def test_a_legacy_function_call_cut_after_its_name_replays_as_written(client: TestClient) -> None:
    """A legacy call is known by its name and arguments text: the history's "" reads as `{}`, which found no id, so
    the call took a positional id, the memory did not know it, and the next prompt re-rendered it closed (`{}}]}`
    where the model stopped). Its prompt is the one the same call replayed as tool_calls gets: the model's text."""
    limit = 42  # cut after the call's name: its arguments ""
    named = {"type": "function", "function": {"name": "get_weather"}}
    tools = {"model": "tiny", "tools": TOOLS[:1], "tool_choice": named, "temperature": 0}
    first = client.post("/v1/chat/completions", json={**tools, "messages": [ASK], "max_tokens": limit}).json()
    (call,) = first["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == "", call
    again = {**tools, "tool_choice": "none", "messages": [ASK, first["choices"][0]["message"], AGAIN], "max_tokens": 1}
    want = client.post("/v1/chat/completions", json=again).json()["usage"]["prompt_tokens"]
    body = {"model": "tiny", "functions": [TOOLS[0]["function"]], "temperature": 0}
    first = client.post(
        "/v1/chat/completions",
        json={**body, "function_call": {"name": "get_weather"}, "messages": [ASK], "max_tokens": limit},
    ).json()
    message = first["choices"][0]["message"]
    assert message["function_call"]["arguments"] == "", message
    again = {**body, "function_call": "none", "messages": [ASK, message, AGAIN], "max_tokens": 1}
    second = client.post("/v1/chat/completions", json=again)
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["prompt_tokens"] == want
    extends(first["usage"], second.json()["usage"], "prompt_tokens", "completion_tokens")
