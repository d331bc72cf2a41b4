"""/v1/responses refuses what /v1/chat/completions refuses in a history, named by the Responses fields: an input
message with `content: []` (no parts) on a user, system or developer message is a 400 naming `input.i.content` (it
was read as empty text and answered 200, where chat answers messages.i.content), `output: []` on a
function_call_output is a 400 naming `input.i.output` (chat's tool message with `content: []`), and a second
function_call_output for one call_id (in input, or after the stored chain's) is a 400 "Duplicate value for
'call_id'" naming `input.i.call_id` (it was rendered as two results of one call; chat refuses a second tool message).
An assistant message with no parts is no text, as chat's; the histories the OpenAI Agents SDK sends (calls, then
their outputs, parallel ones in any order; a cut call answered anyway) still answer 200. The real `openai` client
against the shared tiny server, whole and streamed. And a whole function_call in input that no output answers is
OpenAI's 400 "No tool output found for function call <call_id>" naming its `input.i.call_id` (it was rendered as a
call that had run; chat answers its "did not have response messages" 400); a cut call needs none."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.tiny_tools import TOOLS

pytestmark = pytest.mark.xdist_group("tiny_tools_server")  # the shared server (conftest.py)

FLAT = [{"type": "function", **t["function"]} for t in TOOLS]
ASK = {"role": "user", "content": "Weather in Oslo, and 2 + 3?"}
WEATHER = {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
ADD = {"type": "function_call", "call_id": "call_b", "name": "add", "arguments": '{"a": 2, "b": 3}'}
CUT = {"type": "function_call", "call_id": "call_c", "name": "get_weather", "arguments": '{"city": "Os'}


def output(call_id: str, text: Any = "3 C") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def create(client: openai.OpenAI, items: list[dict[str, Any]], stream: bool = False, **kw: Any) -> Any:
    body = {"model": "tiny", "input": items, "tools": FLAT, "max_output_tokens": 1, "temperature": 0, **kw}
    r = client.responses.create(stream=stream, **body)
    return list(r) if stream else r


def refused(client: openai.OpenAI, items: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    errors = []
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            create(client, items, stream, **kw)
        error = info.value.response.json()["error"]
        assert error["type"] == "invalid_request_error", error
        errors.append(error)
    assert errors[0] == errors[1]
    return errors[0]


@pytest.mark.parametrize("role", ["user", "system", "developer"])
def test_a_message_with_no_parts_is_a_400_naming_its_content(tools_client: openai.OpenAI, role: str) -> None:
    error = refused(tools_client, [ASK, {"role": role, "content": []}])
    assert error["param"] == "input.1.content" and "empty" in error["message"], error
    chat = tools_client.chat.completions.create  # the chat path's answer to the same message
    with pytest.raises(openai.BadRequestError) as info:
        chat(model="tiny", messages=[ASK, {"role": role, "content": []}], max_tokens=1)
    assert info.value.response.json()["error"]["param"] == "messages.1.content"


def test_an_output_with_no_parts_is_a_400_naming_it(tools_client: openai.OpenAI) -> None:
    error = refused(tools_client, [ASK, WEATHER, output("call_a", [])])
    assert error["param"] == "input.2.output" and "empty" in error["message"], error


def test_an_assistant_message_with_no_parts_answers_as_empty_text(tools_client: openai.OpenAI) -> None:
    said = [{"role": "assistant", "content": c} for c in ([], "")]
    first, second = (create(tools_client, [ASK, s, {"role": "user", "content": "?"}]) for s in said)
    assert first.usage.input_tokens == second.usage.input_tokens and first.output_text == second.output_text


@pytest.mark.parametrize(
    ("items", "where", "first"),
    [
        ([ASK, WEATHER, output("call_a", "aborted"), output("call_a")], "input.3.call_id", "input.2"),
        ([ASK, WEATHER, ADD, output("call_b"), output("call_a"), output("call_b")], "input.5.call_id", "input.3"),
        (
            [ASK, WEATHER, output("call_a"), {"role": "user", "content": "?"}, output("call_a")],
            "input.4.call_id",
            "input.2",
        ),
    ],
)
def test_a_second_output_for_one_call_is_a_400_naming_its_call_id(
    tools_client: openai.OpenAI, items: list[dict[str, Any]], where: str, first: str
) -> None:
    error = refused(tools_client, items)
    assert error["param"] == where, error
    assert error["message"].startswith("Invalid parameter: Duplicate value for 'call_id' of 'call_"), error
    assert f"in {first} and {where[: -len('.call_id')]}:" in error["message"], error


def test_a_second_output_after_the_stored_chain_answered_the_call_is_a_400(tools_client: openai.OpenAI) -> None:
    stored = create(tools_client, [ASK, WEATHER, output("call_a")], store=True)
    error = refused(tools_client, [output("call_a", "again")], previous_response_id=stored.id)
    assert error["param"] == "input.0.call_id" and "previous_response_id and input.0" in error["message"], error


@pytest.mark.parametrize(
    ("items", "where"),
    [
        ([ASK, WEATHER, {"role": "user", "content": "Go on."}], "input.1.call_id"),  # a turn after an unanswered call
        ([ASK, WEATHER], "input.1.call_id"),  # calls ending the input
        ([ASK, WEATHER, ADD, output("call_a")], "input.2.call_id"),  # one of two parallel calls answered
        ([ASK, CUT, WEATHER, ADD, output("call_b"), output("call_a"), output("call_a")], "input.6.call_id"),
    ],
)
def test_a_call_in_input_without_its_output_is_openais_400(
    tools_client: openai.OpenAI, items: list[dict[str, Any]], where: str
) -> None:
    """A function_call in input that no function_call_output answers went to the model as a call that had run (chat
    completions refuse it: "did not have response messages"); OpenAI's Responses answer "No tool output found for
    function call". The last case is a duplicate instead, named at the second output."""
    error = refused(tools_client, items)
    assert error["param"] == where, error
    if where != "input.6.call_id":
        assert error["message"].startswith("No tool output found for function call call_"), error


@pytest.mark.parametrize(
    "items",
    [
        [ASK, WEATHER, ADD, output("call_a"), output("call_b", "5")],  # the Agents SDK's: calls, then their outputs
        [ASK, WEATHER, ADD, output("call_b", "5"), output("call_a")],  # parallel outputs out of order
        [ASK, WEATHER, output("call_a"), ADD, output("call_b", "5")],  # call, output, call, output
        [ASK, CUT, output("call_c", "cut short")],  # a cut call answered anyway
        [ASK, CUT, {"role": "user", "content": "Go on."}],  # or not
        [ASK, WEATHER, output("call_a", [{"type": "input_text", "text": "3 C"}])],  # an output as parts
        [ASK, {"role": "assistant", "content": "Let me check."}, WEATHER, output("call_a")],
    ],
)
def test_agents_sdk_histories_still_answer(tools_client: openai.OpenAI, items: list[dict[str, Any]]) -> None:
    for stream in (False, True):
        r = create(tools_client, items, stream)
        done = r[-1].response if stream else r
        assert done.status == "incomplete" and done.usage.input_tokens > 0, done
