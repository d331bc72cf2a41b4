"""OpenAI's Responses API (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`) over HTTP with the real
`openai` package, on the tiny checkpoint's shared server: the response object as the SDK types it (`output_text`
computed by the SDK, not sent), the same answer as the chat endpoint gives the same conversation (it runs on the
chat path), tool calls as `function_call` items whose arguments validate, a tool round trip through
`previous_response_id` and `function_call_output` that renders the same prompt as the whole history and reads the
previous prompt and reply from the cache, json_schema output that validates, `max_output_tokens` as an incomplete
response, SSE events in order whose deltas join to the final response, the stored responses (get, delete,
store=false); hostile values are in test_responses_api_hostile.py."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.tiny_tools import SCHEMAS, TOOL_SCHEMAS, TOOLS, closed

pytestmark = pytest.mark.xdist_group("tiny_tools_server")  # the shared server (conftest.py)

PAGE = 16  # serve's default --page-size
FLAT = [{"type": "function", **t["function"]} for t in TOOLS]  # Responses' flat function tools
SYSTEM = "You call tools."
ASK = "Use a tool to answer: what is 2 + 3, and how warm is Oslo?"


def _post(server, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.v1 + "/responses", json={"model": "tiny", **body}, timeout=60)


def _check_call(item: Any) -> None:
    assert item.type == "function_call" and item.id.startswith("fc_") and item.call_id.startswith("call_")
    jsonschema.validate(json.loads(item.arguments), closed(TOOL_SCHEMAS[item.name]))


def _ask_tools(tools_client, tag: str, **kw: Any) -> Any:
    kw = {"model": "tiny", "instructions": f"{SYSTEM} ({tag})", "input": ASK, "tools": FLAT, **kw}
    kw.setdefault("max_output_tokens", 160)
    return tools_client.responses.create(**kw)


def test_a_text_reply_is_openais_response_object(tools_client, tiny_tools_server) -> None:
    body = {"input": "hello", "max_output_tokens": 5, "temperature": 0, "metadata": {"k": "v"}}
    raw = _post(tiny_tools_server, body).json()
    assert "output_text" not in raw  # the SDK computes it
    r = tools_client.responses.create(model="tiny", **body)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "tiny" and r.error is None
    (message,) = r.output
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    (part,) = message.content
    assert part.type == "output_text" and part.annotations == [] and r.output_text == part.text
    assert r.usage.output_tokens <= 5 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert (r.temperature, r.top_p, r.max_output_tokens, r.metadata) == (0.0, 1.0, 5, {"k": "v"})
    assert (r.tool_choice, r.tools, r.parallel_tool_calls, r.store, r.truncation) == (
        "auto",
        [],
        True,
        True,
        "disabled",
    )
    assert r.text.format.type == "text" and r.previous_response_id is None and isinstance(r.created_at, float)


def test_the_answer_is_the_chat_endpoints_for_the_same_conversation(tools_client) -> None:
    chat = tools_client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}],
        max_tokens=6,
        temperature=0,
    )
    forms = [
        {"instructions": "Be brief.", "input": "hello"},
        {"input": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hello"}]},
        {
            "input": [
                {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Be brief."}]},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "hel"}, {"type": "input_text", "text": "lo"}],
                },
            ]
        },
    ]
    for form in forms:
        r = tools_client.responses.create(model="tiny", max_output_tokens=6, temperature=0, **form)
        assert r.output_text == chat.choices[0].message.content, form
        assert r.usage.input_tokens == chat.usage.prompt_tokens, form


def test_required_and_named_choices_give_function_call_items_that_validate(tools_client) -> None:
    for seed in range(3):
        r = _ask_tools(
            tools_client, "required", tool_choice="required", parallel_tool_calls=False, extra_body={"seed": seed}
        )
        assert r.status == "completed" and [o.type for o in r.output] == ["function_call"], r.output
        _check_call(r.output[0])
    r = _ask_tools(tools_client, "named", tool_choice={"type": "function", "name": "add"}, temperature=0)
    assert r.tool_choice.name == "add" and {o.name for o in r.output} == {"add"}
    for item in r.output:
        _check_call(item)
    r = _ask_tools(tools_client, "none", tool_choice="none", max_output_tokens=4, temperature=0)
    assert [o.type for o in r.output] == ["message"] and r.tools[0].name == "get_weather"


def test_a_tool_round_trip_by_previous_response_id_hits_the_cache_and_equals_the_whole_history(tools_client) -> None:
    first = _ask_tools(tools_client, "round trip", tool_choice="required", parallel_tool_calls=False, temperature=0)
    (call,) = first.output
    _check_call(call)
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
    follow = _ask_tools(tools_client, "round trip", previous_response_id=first.id, input=[answer], temperature=0)
    assert follow.previous_response_id == first.id
    seen = first.usage.input_tokens + first.usage.output_tokens  # the previous prompt and reply, whole pages of it
    assert follow.usage.input_tokens_details.cached_tokens >= (seen - 1) // PAGE * PAGE > 0, follow.usage
    # the same conversation sent whole, as a client without stored responses replays it: the same prompt and answer
    history = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), answer]
    whole = _ask_tools(tools_client, "round trip", input=history, temperature=0)
    assert whole.usage.input_tokens == follow.usage.input_tokens
    assert whole.output_text == follow.output_text and [o.type for o in whole.output] == ["message"]
    # a chain of three: the follow-up's stored conversation carries the first's
    third = _ask_tools(
        tools_client, "round trip", previous_response_id=follow.id, input="and then?", tool_choice="none", temperature=0
    )
    assert third.usage.input_tokens > follow.usage.input_tokens + follow.usage.output_tokens


def test_json_schema_output_validates(tools_client) -> None:
    for seed in range(3):
        fmt = {"type": "json_schema", "name": "flags", "schema": SCHEMAS["flags"], "strict": True}
        r = tools_client.responses.create(
            model="tiny",
            input="Describe flags.",
            text={"format": fmt},
            max_output_tokens=120,
            extra_body={"seed": seed},
        )
        assert r.status == "completed" and r.text.format.type == "json_schema" and r.text.format.name == "flags"
        jsonschema.validate(json.loads(r.output_text), closed(SCHEMAS["flags"]))
    r = tools_client.responses.create(
        model="tiny",
        input="JSON please",
        text={"format": {"type": "json_object"}},
        max_output_tokens=60,
        extra_body={"seed": 1},
    )
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)


def test_max_output_tokens_makes_an_incomplete_response(tools_client) -> None:
    r = tools_client.responses.create(model="tiny", input="Tell me a long story.", max_output_tokens=3, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"


def test_a_follow_up_to_a_call_cut_short_keeps_that_call_and_is_answered(tools_client) -> None:
    """A call cut by max_output_tokens has arguments that are no JSON object: replayed, every follow-up by
    previous_response_id was a 400 once, then the call was dropped (the prompt lacked what the model wrote). It is
    in the history, as written."""
    for budget in (8, 16, 24, 32, 48, 64, 96):
        first = _ask_tools(tools_client, "cut", tool_choice="required", max_output_tokens=budget, temperature=0)
        cut = [o for o in first.output if o.type == "function_call"]
        if first.status == "incomplete" and cut:
            break
    else:
        pytest.fail("no budget cut a call short")
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut[-1].arguments)
    answer = {"type": "function_call_output", "call_id": cut[-1].call_id, "output": "5"}
    for given in ("Go on.", [answer]):
        follow = _ask_tools(
            tools_client, "cut", previous_response_id=first.id, input=given, max_output_tokens=2, temperature=0
        )  # greedy: sampled, the reply could end within its 2 tokens (a flaky `completed`)
        assert follow.status == "incomplete" and follow.usage.output_tokens == 2
        listed = [i for i in tools_client.responses.input_items.list(follow.id, order="asc", limit=100)]
        assert [(i.id, i.arguments) for i in listed if i.id == cut[-1].id] == [(cut[-1].id, cut[-1].arguments)]


def _events(server, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream(
        "POST", server.v1 + "/responses", json={"model": "tiny", **body, "stream": True}, timeout=60
    ) as r:
        assert r.status_code == 200, r.read()
        lines = list(r.iter_lines())
    kinds = [line[7:] for line in lines if line.startswith("event: ")]
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert kinds == [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_a_text_stream_sends_openais_events_and_its_deltas_join_to_the_final_response(
    tools_client, tiny_tools_server
) -> None:
    body = {"input": "hello there", "max_output_tokens": 12, "temperature": 0}
    whole = tools_client.responses.create(model="tiny", **body)
    events = _events(tiny_tools_server, body)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{whole.status}",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    assert text == events[-4]["text"] == final["output"][0]["content"][0]["text"] == whole.output_text
    assert final["output"][0]["id"] == events[2]["item"]["id"] == events[-2]["item"]["id"]
    assert final["usage"]["output_tokens"] == whole.usage.output_tokens and final["id"] == events[0]["response"]["id"]


def test_a_tool_call_stream_assembles_to_the_whole_call_and_the_sdk_stream_completes(
    tools_client, tiny_tools_server
) -> None:
    kw = {"tool_choice": "required", "parallel_tool_calls": False, "temperature": 0}
    whole = _ask_tools(tools_client, "stream", **kw)
    body = {"instructions": f"{SYSTEM} (stream)", "input": ASK, "tools": FLAT, "max_output_tokens": 160, **kw}
    events = _events(tiny_tools_server, body)
    added = next(e for e in events if e["type"] == "response.output_item.added")["item"]
    assert added["type"] == "function_call" and added["arguments"] == "" and added["status"] == "in_progress"
    pieces = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    (call,) = whole.output
    assert (added["name"], pieces, done["arguments"]) == (call.name, call.arguments, call.arguments)
    assert events[-1]["type"] == "response.completed"
    assert [(o["name"], o["arguments"]) for o in events[-1]["response"]["output"]] == [(call.name, call.arguments)]
    with tools_client.responses.stream(model="tiny", **body) as stream:  # the SDK's helper assembles the same
        final = stream.get_final_response()
    assert [(o.name, o.arguments) for o in final.output] == [(call.name, call.arguments)]


def test_streams_abandoned_midway_leave_nothing_locked(tools_client, tiny_tools_server) -> None:
    body = {"model": "tiny", "input": ASK, "tools": FLAT, "tool_choice": "required", "stream": True}
    body |= {"max_output_tokens": 160, "temperature": 1.0}

    def abandon(seed: int, after: int) -> int:
        seen = 0
        with httpx.stream("POST", tiny_tools_server.v1 + "/responses", json={**body, "seed": seed}, timeout=60) as r:
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen >= after:
                    break
        return seen

    with ThreadPoolExecutor(4) as pool:
        assert all(n >= 1 for n in pool.map(abandon, range(4), [1, 3, 5, 9]))
    assert tiny_tools_server.locked_blocks_settled() == 0


def test_stored_responses_are_read_deleted_and_store_false_keeps_none(tools_client, tiny_tools_server) -> None:
    r = tools_client.responses.create(model="tiny", input="keep me", max_output_tokens=3, temperature=0)
    got = tools_client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.usage == r.usage
    tools_client.responses.delete(r.id)
    for call in (lambda: tools_client.responses.retrieve(r.id), lambda: tools_client.responses.delete(r.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    gone = _post(tiny_tools_server, {"input": "next", "previous_response_id": r.id})
    assert gone.status_code == 400 and gone.json()["error"]["code"] == "previous_response_not_found"
    unstored = tools_client.responses.create(model="tiny", input="forget me", max_output_tokens=3, store=False)
    assert unstored.store is False
    with pytest.raises(openai.BadRequestError) as exc:
        tools_client.responses.create(model="tiny", input="next", previous_response_id=unstored.id)
    assert exc.value.code == "previous_response_not_found" and exc.value.param == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        tools_client.responses.retrieve(unstored.id)


def test_refused_model_and_accepted_no_op_fields(tools_client, tiny_tools_server) -> None:
    r = _post(tiny_tools_server, {"model": "gpt-4o", "input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    ok = tools_client.responses.create(
        model="tiny",
        input="hi",
        max_output_tokens=2,
        reasoning={"effort": None},
        include=["reasoning.encrypted_content"],
        truncation="disabled",
        service_tier="auto",
        prompt_cache_key="conversation-1",
        safety_identifier="user-1",
        user="alice",
        tools=[],
        parallel_tool_calls=True,
    )
    assert ok.status == "incomplete" and ok.prompt_cache_key == "conversation-1" and ok.user == "alice"


def test_input_items_lists_the_conversation_a_response_answered_in_pages(tools_client, tiny_tools_server) -> None:
    first = _ask_tools(tools_client, "items", tool_choice="required", parallel_tool_calls=False, temperature=0)
    (call,) = first.output
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "5", "id": "fco_mine"}
    follow = _ask_tools(tools_client, "items", previous_response_id=first.id, input=[answer], max_output_tokens=2)
    listed = list(tools_client.responses.input_items.list(follow.id, order="asc", limit=2))  # two pages
    assert [i.type for i in listed] == ["message", "function_call", "function_call_output"]
    assert listed[0].role == "user" and listed[0].content[0].text == ASK and listed[0].id.startswith("msg_")
    assert (listed[1].id, listed[1].call_id, listed[1].arguments) == (call.id, call.call_id, call.arguments)
    assert (listed[2].id, listed[2].output) == ("fco_mine", "5")
    page = tools_client.responses.input_items.list(follow.id, limit=1)  # OpenAI's default order: the latest first
    assert page.data[0].id == "fco_mine" and page.has_more and page.first_id == page.last_id == "fco_mine"
    for query, param in (({"limit": 0}, "limit"), ({"order": "up"}, "order"), ({"after": "x" * 300}, "after")):
        bad = httpx.get(tiny_tools_server.v1 + f"/responses/{follow.id}/input_items", params=query, timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text  # OpenAI's: the name
    with pytest.raises(openai.NotFoundError):
        tools_client.responses.input_items.list("resp_unknown")
