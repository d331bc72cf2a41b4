"""A Responses follow-up by `previous_response_id` to a response that made calls must answer each with a
`function_call_output` item: OpenAI answers a follow-up without one 400 "No tool output found for function call
<call_id>" (param `input`). Ours went on as if the call had run: the model read a turn with calls and no results.
A call cut short was not made and needs no output. And an output must answer a call of the conversation: OpenAI
answers 400 "No tool call found for function call output with call_id <call_id>"; ours rendered a tool result for
no call. In-process app on the tiny checkpoint, whole and streamed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.server.keyed_tiny import tiny_client
from tests.server.test_responses_api import ASK, FLAT, SYSTEM


@pytest.fixture(scope="module")
def client(tmp_path_factory: Any) -> Iterator[TestClient]:
    with tiny_client(tmp_path_factory, "unanswered") as c:
        yield c


def ask(client: TestClient, **body: Any) -> Any:
    body = {"model": "tiny", "instructions": SYSTEM, "input": ASK, "tools": FLAT, "temperature": 0, **body}
    return client.post("/v1/responses", json=body)


def made_call(client: TestClient) -> dict[str, Any]:
    first = ask(client, tool_choice="required", parallel_tool_calls=False, max_output_tokens=160).json()
    assert first["status"] == "completed", first
    (call,) = first["output"]
    assert call["type"] == "function_call" and call["status"] == "completed"
    return {"id": first["id"], "call_id": call["call_id"]}


def test_a_follow_up_without_the_calls_output_is_openais_400(client: TestClient) -> None:
    first = made_call(client)
    other = {"type": "function_call_output", "call_id": "call_other", "output": "5"}
    for given in ("Go on.", [{"role": "user", "content": "Go on."}], [other]):
        for stream in (False, True):
            r = ask(client, previous_response_id=first["id"], input=given, max_output_tokens=2, stream=stream)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == "input" and error["type"] == "invalid_request_error"
            assert error["message"].startswith(f"No tool output found for function call {first['call_id']}")
    answer = {"type": "function_call_output", "call_id": first["call_id"], "output": "5"}
    for given in ([answer], [answer, {"role": "user", "content": "and?"}]):
        r = ask(client, previous_response_id=first["id"], input=given, max_output_tokens=2)
        assert r.status_code == 200 and r.json()["previous_response_id"] == first["id"], r.text
    # the answered follow-up's reply is text: a further turn needs no output
    follow = r.json()
    assert all(o["type"] == "message" for o in follow["output"])
    r = ask(client, previous_response_id=follow["id"], input="more", tool_choice="none", max_output_tokens=2)
    assert r.status_code == 200, r.text


def test_a_call_cut_short_needs_no_output(client: TestClient) -> None:
    for budget in (48, 64, 80, 24, 32):
        first = ask(client, tool_choice="required", max_output_tokens=budget).json()
        calls = [o for o in first["output"] if o["type"] == "function_call"]
        if first["status"] == "incomplete" and calls and calls[-1]["status"] == "incomplete":
            break
    else:
        pytest.fail("no budget cut a call short")
    made = [c for c in calls if c["status"] == "completed"]
    answers = [{"type": "function_call_output", "call_id": c["call_id"], "output": "5"} for c in made]
    r = ask(client, previous_response_id=first["id"], input=[*answers, {"role": "user", "content": "Go on."}])
    assert r.status_code == 200, r.text


def test_an_output_that_answers_no_call_is_openais_400(client: TestClient) -> None:
    text = ask(client, tool_choice="none", max_output_tokens=2).json()
    nope = {"type": "function_call_output", "call_id": "nope", "output": "5"}
    for body in (
        {"previous_response_id": text["id"], "input": [nope]},
        {"input": [{"role": "user", "content": "x"}, nope]},
    ):
        for stream in (False, True):
            r = ask(client, **body, max_output_tokens=2, stream=stream)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["message"].startswith("No tool call found for function call output with call_id nope")
            assert error["param"] == f"input.{len(body['input']) - 1}.call_id"
    call = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1, "b": 2}'}
    answer = {**nope, "call_id": "c1"}
    r = ask(client, input=[{"role": "user", "content": "add"}, call, answer], max_output_tokens=2)
    assert r.status_code == 200, r.text  # the call is in the request, before its output
    first = made_call(client)
    answer = {**nope, "call_id": first["call_id"]}
    r = ask(client, previous_response_id=first["id"], input=[answer], max_output_tokens=2)
    assert r.status_code == 200, r.text  # the call is the previous response's
