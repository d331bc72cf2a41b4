"""/v1/chat/completions checks a history's tool turns against its calls, as OpenAI does: a tool message that answers
no call of an assistant message before it ("messages with role 'tool' must be a response to a preceeding message with
'tool_calls'"), one that answers a call twice ("Duplicate value for 'tool_call_id'"), and an assistant message whose
calls are not all answered ("... The following tool_call_ids did not have response messages: ...") are 400s naming the
field. Before, each was rendered: the model read a result for no call, or went on as if a call had run. The orders
agent frameworks send stay accepted: parallel results out of order, one assistant message per call (their results
after them or between them), empty results and results as content parts; a call the length limit cut needs no
result (as in the Responses API), in the tool and legacy forms alike. The real `openai` client, whole and streamed."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.tiny_tools import TOOLS
from tests.tool_turn_messages import AGAIN, ASK, CUT, WEATHER, call, calls, result

pytestmark = pytest.mark.xdist_group("tiny_tools_server")  # the shared server (conftest.py)


def send(client: openai.OpenAI, messages: list[dict[str, Any]], stream: bool = False, **kw: Any) -> Any:
    kw = {"model": "tiny", "messages": messages, "max_tokens": 1, "temperature": 0, "stream": stream, **kw}
    if "functions" not in kw:
        kw["tools"] = TOOLS
    r = client.chat.completions.create(**kw)
    return list(r) if stream else r


def refused(client: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any) -> list[dict[str, Any]]:
    """The 400's error body, whole and streamed (the same)."""
    errors = []
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            send(client, messages, stream, **kw)
        error = info.value.response.json()["error"]
        assert error["type"] == "invalid_request_error", error
        errors.append(error)
    assert errors[0] == errors[1]
    return errors[0]


STRAY = "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."
UNANSWERED = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. "
    "The following tool_call_ids did not have response messages: "
)


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([ASK, result("call_1")], "messages.1.tool_call_id"),  # no call at all
        ([ASK, calls(call("call_1")), result("call_2")], "messages.2.tool_call_id"),  # a wrong id
        ([ASK, calls(call("call_1")), result("call_1"), AGAIN, result("call_1")], "messages.4.tool_call_id"),
        # a plain reply closes the calls before it (this one cut short: it needed no result)
        ([ASK, calls(call("c", CUT)), {"role": "assistant", "content": "x"}, result("c")], "messages.3.tool_call_id"),
    ],
)
def test_a_result_that_answers_no_call_before_it_is_openais_400(tools_client, messages, param) -> None:
    error = refused(tools_client, messages)
    assert error["param"] == param and error["message"].startswith(STRAY), error


def test_a_call_answered_twice_is_openais_400(tools_client) -> None:
    messages = [ASK, calls(call("call_1")), result("call_1"), result("call_1", "again")]
    error = refused(tools_client, messages)
    assert error["param"] == "messages.3.tool_call_id", error
    assert error["message"].startswith(
        "Invalid parameter: Duplicate value for 'tool_call_id' of 'call_1', in messages[2] and messages[3]"
    )


@pytest.mark.parametrize(
    ("messages", "param", "ids"),
    [
        ([ASK, calls(call("call_1"))], "messages.1.tool_calls.0.id", "call_1"),  # the history ends with the calls
        ([ASK, calls(call("call_1"), call("call_2")), result("call_1"), AGAIN], "messages.1.tool_calls.1.id", "call_2"),
        ([ASK, calls(call("call_1"), call("call_2")), AGAIN], "messages.1.tool_calls.0.id", "call_1, call_2"),
        # a later reply's call left unanswered: the run's results do not cover it
        ([ASK, calls(call("call_1")), result("call_1"), calls(call("call_2"))], "messages.3.tool_calls.0.id", "call_2"),
        # the same id made again by a later reply (Mistral's short ids) needs its own result
        (
            [ASK, calls(call("call_1")), result("call_1"), calls(call("call_1")), AGAIN],
            "messages.3.tool_calls.0.id",
            "call_1",
        ),
    ],
)
def test_calls_left_without_results_are_openais_400(tools_client, messages, param, ids) -> None:
    error = refused(tools_client, messages)
    assert error["param"] == param and error["message"] == UNANSWERED + ids, error


@pytest.mark.parametrize(
    "messages",
    [
        [ASK, calls(call("call_1"), call("call_2", '{"a": 2, "b": 3}', "add")), result("call_2"), result("call_1")],
        [ASK, calls(call("call_1")), calls(call("call_2")), result("call_1"), result("call_2")],  # one message a call
        [ASK, calls(call("call_1")), result("call_1"), calls(call("call_2")), result("call_2")],
        [ASK, calls(call("call_1")), result("call_1", ""), AGAIN],  # an empty result
        [ASK, calls(call("call_1")), result("call_1", [{"type": "text", "text": "3 "}, {"type": "text", "text": "C"}])],
        [ASK, calls(call("call_1", CUT)), AGAIN],  # a call cut short was not made: it needs no result
        [ASK, calls(call("call_1", "")), AGAIN],  # nor one cut after its name
        [ASK, calls(call("call_1"), call("call_2", CUT)), result("call_1")],
        [ASK, calls(call("call_1", CUT)), result("call_1")],  # it may still have one
        [ASK, calls(call("call_1")), result("call_1"), AGAIN, calls(call("call_1")), result("call_1")],  # id reused
    ],
)
def test_the_orders_agents_send_are_answered(tools_client, messages) -> None:
    for stream in (False, True):
        send(tools_client, messages, stream)  # no error


LEGACY = [t["function"] for t in TOOLS]


def legacy_call(arguments: str | None = WEATHER) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": arguments}}


def legacy_result(name: str = "get_weather") -> dict[str, Any]:
    return {"role": "function", "name": name, "content": "3 C"}


def test_legacy_function_turns_are_checked_the_same_way(tools_client) -> None:
    error = refused(tools_client, [ASK, legacy_result()], functions=LEGACY)
    assert error["param"] == "messages.1.name", error
    assert error["message"].startswith(
        "Invalid parameter: messages with role 'function' must be a response to a preceeding message with "
        "'function_call'."
    )
    error = refused(tools_client, [ASK, legacy_call(), AGAIN], functions=LEGACY)
    assert error["param"] == "messages.1.function_call", error
    error = refused(tools_client, [ASK, legacy_call(), legacy_result(), legacy_result()], functions=LEGACY)
    assert error["param"] == "messages.3.name", error
    for messages in (
        [ASK, legacy_call(), legacy_result()],
        [ASK, legacy_call(), legacy_result("add")],  # the name of no call: it answers the latest (legacy.py)
        [ASK, legacy_call(CUT), AGAIN],
        [ASK, legacy_call(""), AGAIN],
    ):
        send(tools_client, messages, functions=LEGACY)


def test_a_model_made_call_round_trip_still_answers(tools_client) -> None:
    """A call the model made, answered as OpenAI's guide does, and one it made and a client dropped."""
    first = send(tools_client, [ASK], tool_choice="required", parallel_tool_calls=False, max_tokens=160)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls", first
    (made,) = message.tool_calls
    answered = [ASK, message.model_dump(exclude_none=True), result(made.id)]
    send(tools_client, answered)
    error = refused(tools_client, [*answered[:2], AGAIN])
    assert error["message"] == UNANSWERED + made.id, error
