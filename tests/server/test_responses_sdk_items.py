"""Responses input replayed as the openai SDK dumps it: `item.model_dump(by_alias=True)` of a function call (openai
3.63) carries `async`, `caller` and `namespace` (null unless set), and a listed item `created_by` (an output also
`name`), which were 400s (`Unrecognized input item field: input.1.async`). They are accepted where they leave the
prompt as it is; any other field is still refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from openai.types.responses import ResponseFunctionToolCall

from tests.server.keyed_tiny import tiny_client
from tests.tiny_tools import TOOLS

FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
CALL = ResponseFunctionToolCall(type="function_call", call_id="call_1", name="add", arguments='{"a": 1, "b": 2}')


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with tiny_client(tmp_path_factory, "responses_sdk_items") as c:
        yield c


def _input(call: dict[str, Any]) -> list[dict[str, Any]]:
    answer = {"type": "function_call_output", "call_id": "call_1", "output": "3"}
    return [{"role": "user", "content": "Add one and two."}, call, answer]


def _post(client: TestClient, call: dict[str, Any]) -> Any:
    body = {"model": "tiny", "input": _input(call), "tools": FLAT_TOOLS, "max_output_tokens": 1, "temperature": 0}
    return client.post("/v1/responses", json=body)


def test_a_call_dumped_by_the_sdk_replays_as_the_call(client: TestClient) -> None:
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=0)
    dumped = CALL.model_dump(by_alias=True)
    assert {"async", "caller", "namespace"} <= dumped.keys()  # what openai 3.63 writes
    r = sdk.responses.create(model="tiny", input=_input(dumped), tools=FLAT_TOOLS, max_output_tokens=1, temperature=0)
    plain = _post(client, {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": CALL.arguments})
    assert plain.status_code == 200 and r.usage.input_tokens == plain.json()["usage"]["input_tokens"]
    for context in ({"async": True}, {"async": False}, {"caller": {"type": "direct"}}):
        again = _post(client, {**dumped, **context})
        assert again.status_code == 200 and again.json()["usage"]["input_tokens"] == r.usage.input_tokens, again.text


def test_listed_input_items_dumped_by_the_sdk_replay_as_the_conversation(client: TestClient) -> None:
    """`input_items.list` parses the items as the SDK's item types, whose dumps add `created_by` (and, on an output,
    `caller`, `name` and `namespace`): the listed conversation sent back is the same prompt."""
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=0)
    first = sdk.responses.create(
        model="tiny", input=_input(CALL.model_dump(by_alias=True)), tools=FLAT_TOOLS, max_output_tokens=1, temperature=0
    )
    items = [item.model_dump(by_alias=True) for item in sdk.responses.input_items.list(first.id, order="asc")]
    assert [i["type"] for i in items] == ["message", "function_call", "function_call_output"]
    assert "created_by" in items[1] and {"caller", "name", "namespace", "created_by"} <= items[2].keys()
    again = sdk.responses.create(model="tiny", input=items, tools=FLAT_TOOLS, max_output_tokens=1, temperature=0)
    assert again.usage.input_tokens == first.usage.input_tokens
    items[0]["content"][0]["prompt_cache_breakpoint"] = {"mode": "explicit"}  # a cache instruction: not honoured here
    body = {"model": "tiny", "input": items, "tools": FLAT_TOOLS, "max_output_tokens": 1}
    refused = client.post("/v1/responses", json=body)
    assert (
        refused.status_code == 400 and refused.json()["error"]["param"] == "input.0.content.0.prompt_cache_breakpoint"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("async", "yes"),
        ("caller", {"type": "program", "caller_id": "ci_1"}),
        ("caller", "direct"),
        ("namespace", "billing"),
        ("created_by", 3),
        ("bogus", None),
    ],
)
def test_values_that_would_change_the_call_and_unknown_fields_are_400s(
    client: TestClient, field: str, value: Any
) -> None:
    r = _post(client, {**CALL.model_dump(by_alias=True), field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == f"input.1.{field}", r.text
    if field == "bogus":
        assert r.json()["error"]["message"] == "Unrecognized input item field: input.1.bogus"
