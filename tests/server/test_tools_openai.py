"""Tool calls over HTTP with the real `openai` package, on the tiny checkpoint: `tools` with tool_choice required,
named, auto and none; replies with `tool_calls` (content null, finish_reason tool_calls) whose arguments validate
against their tools' schemas (jsonschema: the grammar makes a random model's output valid); streams that carry
OpenAI's tool-call deltas and assemble to the whole reply's calls; an agent loop replaying assistant calls and tool
results, each turn reporting the previous prompt and output cached in whole pages."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import pytest

from tests.tiny_tools import TOOLS, check_calls, closed

pytestmark = pytest.mark.xdist_group("tiny_tools_server")  # the shared server (conftest.py)

PAGE = 16  # serve's default --page-size
ASK = "Use a tool to answer: what is 2 + 3, and how warm is Oslo?"


def _messages(tag: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": f"You call tools. ({tag})"}, {"role": "user", "content": ASK}]


def _ask(tools_client, tag: str, **kw: Any) -> Any:
    kw = {"model": "tiny", "messages": _messages(tag), "tools": TOOLS, "max_tokens": 160, **kw}
    return tools_client.chat.completions.create(**kw)


def test_required_gives_calls_that_validate_over_varied_seeds(tools_client) -> None:
    for seed in range(6):
        r = _ask(
            tools_client,
            f"required {seed}",
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
        assert len(check_calls(choice.message.tool_calls)) == 1


def test_parallel_calls_each_validate_and_have_their_own_ids(tools_client) -> None:
    # The random model rarely closes the list of calls: every call but a last one cut at the length validates.
    for seed in range(2):
        r = _ask(tools_client, "parallel", tool_choice="required", temperature=1.0, seed=seed, max_tokens=240)
        choice = r.choices[0]
        calls = choice.message.tool_calls
        assert calls and choice.finish_reason in ("tool_calls", "length") and choice.message.content is None
        check_calls(calls if choice.finish_reason == "tool_calls" else calls[:-1] or None)
        assert len({c.id for c in calls}) == len(calls)


def test_a_named_choice_calls_that_tool_and_parallel_false_makes_one_call(tools_client) -> None:
    for seed in range(3):
        r = _ask(
            tools_client,
            "named",
            tool_choice={"type": "function", "function": {"name": "add"}},
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
        )
        assert [name for name, _ in check_calls(r.choices[0].message.tool_calls)] == ["add"]


def test_a_named_choice_makes_exactly_one_call_even_with_parallel_calls(tools_client) -> None:
    """OpenAI's forced function ("Call exactly one specific function", its function-calling guide) is one call
    with parallel_tool_calls left true too: the random model wrote 1 to 3 calls of it under a grammar of a list."""
    named = {"type": "function", "function": {"name": "add"}}
    r = _ask(tools_client, "named, parallel", tool_choice=named, temperature=1.0, seed=4, n=8, max_tokens=240)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls", choice
        assert [name for name, _ in check_calls(choice.message.tool_calls)] == ["add"], choice.message.tool_calls


def test_none_shows_the_tools_but_parses_no_call_and_auto_parses_what_is_there(tools_client) -> None:
    r = _ask(tools_client, "none", tool_choice="none", temperature=0, max_tokens=6)
    assert r.choices[0].message.tool_calls is None and isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    for seed in range(3):  # the random model rarely writes a call by itself; whatever is parsed is a valid call
        r = _ask(tools_client, "auto", temperature=1.0, seed=seed, max_tokens=12)
        message = r.choices[0].message
        if message.tool_calls:
            check_calls(message.tool_calls)
        else:
            assert isinstance(message.content, str) and r.choices[0].finish_reason in ("stop", "length")


def _sse(tiny_tools_server, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", tiny_tools_server.v1 + "/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
def test_a_stream_carries_openais_tool_call_deltas_and_assembles_to_the_whole_reply(
    tools_client, tiny_tools_server, choice
) -> None:
    kw = {"tool_choice": choice, "parallel_tool_calls": False, "temperature": 0}
    whole = _ask(tools_client, "stream", **kw)
    body = {"model": "tiny", "messages": _messages("stream"), "tools": TOOLS, "max_tokens": 160, **kw}
    chunks = _sse(tiny_tools_server, {**body, "stream": True, "stream_options": {"include_usage": True}})
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    assert deltas[0]["delta"] == {"role": "assistant", "content": None}  # as OpenAI's when the reply may be calls
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas[1:-1]:
        assert d["finish_reason"] is None and set(d["delta"]) == {"tool_calls"}, d  # no content around the calls
        (tc,) = d["delta"]["tool_calls"]
        if tc["index"] not in calls:  # a call's first delta: index, id, type, name and empty arguments
            assert set(tc) == {"index", "id", "type", "function"} and tc["type"] == "function"
            assert tc["function"]["arguments"] == "" and tc["index"] == len(calls)
            calls[tc["index"]] = {"id": tc["id"], "name": tc["function"]["name"], "arguments": ""}
        else:  # then only index and an arguments fragment
            assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
            calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
    assert deltas[-1] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}
    streamed = [(c["name"], c["arguments"]) for c in calls.values()]
    message = whole.choices[0].message
    assert streamed == [(c.function.name, c.function.arguments) for c in message.tool_calls]
    check_calls([{"id": c["id"], "type": "function", "function": c} for c in calls.values()])
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == whole.usage.completion_tokens
    assert usage["prompt_tokens_details"]["cached_tokens"] >= whole.usage.prompt_tokens // PAGE * PAGE - PAGE


def test_the_sdk_stream_assembles_to_the_same_calls(tools_client) -> None:
    kw = {"tool_choice": "required", "temperature": 0, "parallel_tool_calls": False}
    whole = _ask(tools_client, "sdk stream", **kw).choices[0].message
    names, arguments, ids = {}, {}, {}
    for chunk in _ask(tools_client, "sdk stream", stream=True, **kw):
        for tc in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
            ids.setdefault(tc.index, tc.id)
            names[tc.index] = names.get(tc.index, "") + (tc.function.name or "")
            arguments[tc.index] = arguments.get(tc.index, "") + (tc.function.arguments or "")
    assert [(names[i], arguments[i]) for i in sorted(names)] == [
        (c.function.name, c.function.arguments) for c in whole.tool_calls
    ]
    assert all(i.startswith("call_") for i in ids.values())


def test_n_streamed_choices_with_logprobs_each_assemble_to_their_whole_calls(tools_client) -> None:
    kw = {"tool_choice": "required", "parallel_tool_calls": False, "n": 2, "temperature": 1.0, "seed": 3}
    whole = _ask(tools_client, "n stream", **kw)
    calls: dict[int, list[str]] = {}
    logprobs, finish = 0, {}
    stream = _ask(tools_client, "n stream", stream=True, logprobs=True, stream_options={"include_usage": True}, **kw)
    for chunk in stream:
        for c in chunk.choices:
            for tc in c.delta.tool_calls or ():
                assert tc.index == 0
                got = calls.setdefault(c.index, ["", "", ""])
                got[0] += tc.id or ""
                got[1] += tc.function.name or ""
                got[2] += tc.function.arguments or ""
            logprobs += len(c.logprobs.content) if c.logprobs else 0
            finish[c.index] = c.finish_reason or finish.get(c.index)
        usage = chunk.usage or None
    assert finish == {0: "tool_calls", 1: "tool_calls"}
    for c in whole.choices:
        (call,) = c.message.tool_calls
        assert calls[c.index][1:] == [call.function.name, call.function.arguments]
        check_calls(
            [
                {
                    "id": calls[c.index][0],
                    "type": "function",
                    "function": {"name": calls[c.index][1], "arguments": calls[c.index][2]},
                }
            ]
        )
    assert usage is not None and logprobs == usage.completion_tokens == whole.usage.completion_tokens


def test_an_agent_loop_over_http_hits_the_previous_prompt_and_output_in_whole_pages(tools_client) -> None:
    messages = _messages("agent loop")
    previous = None
    for step in range(3):
        r = tools_client.chat.completions.create(
            model="tiny",
            messages=messages,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=160,
            temperature=0.9,
            seed=step,
        )
        message = r.choices[0].message
        check_calls(message.tool_calls)
        if previous is not None:  # the KV of the previous prompt and all but its last output token, whole pages
            assert r.usage.prompt_tokens_details.cached_tokens >= (previous - 1) // PAGE * PAGE, (step, r.usage)
        previous = r.usage.prompt_tokens + r.usage.completion_tokens
        messages.append({**message.model_dump(exclude_none=True), "content": None})  # as agents replay it
        messages += [
            {"role": "tool", "tool_call_id": c.id, "name": c.function.name, "content": f"result {step}"}
            for c in message.tool_calls
        ]
    final = tools_client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=4, temperature=0
    )
    assert final.choices[0].message.tool_calls is None
    assert final.usage.prompt_tokens_details.cached_tokens >= (previous - 1) // PAGE * PAGE


def test_null_tool_fields_count_as_absent(tools_client) -> None:
    nulls = [{"type": "function", "function": {**t["function"], "description": None, "strict": None}} for t in TOOLS]
    r = _ask(tools_client, "nulls", tools=nulls, tool_choice="required", parallel_tool_calls=False, temperature=0)
    check_calls(r.choices[0].message.tool_calls)


def test_tool_streams_abandoned_mid_call_leave_nothing_locked(tools_client, tiny_tools_server) -> None:
    body = {"model": "tiny", "messages": _messages("abandoned"), "tools": TOOLS, "tool_choice": "required"}
    body |= {"max_tokens": 160, "temperature": 1.0, "stream": True}

    def abandon(seed: int, after: int) -> int:
        seen = 0
        with httpx.stream(
            "POST", tiny_tools_server.v1 + "/chat/completions", json={**body, "seed": seed}, timeout=60
        ) as r:
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen >= after:
                    break  # the client goes away mid-call
        return seen

    with ThreadPoolExecutor(6) as pool:
        assert all(n >= 1 for n in pool.map(abandon, range(6), [2, 3, 5, 8, 13, 21]))
    assert tiny_tools_server.locked_blocks_settled() == 0
    check_calls(
        _ask(tools_client, "after abandon", tool_choice="required", parallel_tool_calls=False, temperature=0)
        .choices[0]
        .message.tool_calls
    )


def test_developer_is_the_system_message_and_names_are_accepted(tools_client) -> None:
    def reply(role: str, **extra: Any) -> Any:
        messages = [{"role": role, "content": "Be brief."}, {"role": "user", "content": "hello", **extra}]
        return tools_client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)

    system, developer = reply("system"), reply("developer")
    assert developer.usage.prompt_tokens == system.usage.prompt_tokens
    assert developer.choices[0].message.content == system.choices[0].message.content
    assert reply("system", name="alice").usage.completion_tokens >= 1


PYDANTIC_PARAMETERS = {  # what pydantic's model_json_schema() writes for a model with an enum field
    "$defs": {"Color": {"enum": ["red", "blue"], "title": "Color", "type": "string"}},
    "properties": {"color": {"$ref": "#/$defs/Color"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["color", "n"],
    "title": "Pick",
    "type": "object",
}


def test_tool_parameters_with_defs_refs_are_enforced(tools_client) -> None:
    """pydantic's schemas (LangChain's bind_tools, with_structured_output function_calling) name their enums and
    nested models in `$defs`: under a named and a required choice the calls validate against them."""
    tool = {"type": "function", "function": {"name": "pick", "parameters": PYDANTIC_PARAMETERS, "strict": True}}
    for choice in ({"type": "function", "function": {"name": "pick"}}, "required"):
        for seed in range(3):
            r = tools_client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "pick"}],
                tools=[tool, TOOLS[1]],
                tool_choice=choice,
                parallel_tool_calls=False,
                max_tokens=120,
                temperature=1.0,
                seed=seed,
            )
            (call,) = r.choices[0].message.tool_calls
            schema = PYDANTIC_PARAMETERS if call.function.name == "pick" else TOOLS[1]["function"]["parameters"]
            jsonschema.validate(json.loads(call.function.arguments), closed(schema))


OK = [{"role": "user", "content": "hi"}]
ONE_TOOL = [TOOLS[1]]
HOSTILE = [
    ({"tools": 5}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools.0.function"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools.0.function.name"),
    ({"tools": [TOOLS[1], TOOLS[1]]}, "tools.1.function.name"),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"x": {"type": "integr"}}},
                    },
                }
            ]
        },
        "tools.0.function.parameters.properties.x.type",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
        "tools.0.function.parameters.type",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/$defs/x"}}}]},
        "tools.0.function.parameters.$ref",
    ),
    (
        {"tools": ONE_TOOL, "tool_choice": {"type": "function", "function": {"name": "unknown"}}},
        "tool_choice.function.name",
    ),
    ({"tools": ONE_TOOL, "tool_choice": {"type": "function"}}, "tool_choice"),
    # an unknown field of a named choice was dropped, the choice taken without it (as a tool's field was)
    (
        {"tools": ONE_TOOL, "tool_choice": {"type": "function", "function": {"name": "add"}, "functon": 1}},
        "tool_choice.functon",
    ),
    (
        {"tools": ONE_TOOL, "tool_choice": {"type": "function", "function": {"name": "add", "strict": True}}},
        "tool_choice.function.strict",
    ),
    ({"functions": [TOOLS[1]["function"]], "function_call": {"name": "add", "x": 1}}, "function_call.x"),
    # a misspelt field was dropped: the tool ran without its schema, called with {} (as /v1/responses refuses it)
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameter": {"type": "object"}}}]},
        "tools.0.function.parameter",
    ),
    ({"tools": [{"type": "function", "function": {"name": "f"}, "strict": True}]}, "tools.0.strict"),
    ({"tools": ONE_TOOL, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"parallel_tool_calls": True}, "parallel_tool_calls"),
    ({"tools": ONE_TOOL, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"functions": [{"name": "f"}], "tools": ONE_TOOL}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "messages.0.tool_call_id"),
    ({"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}, "messages.0.tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages.0.tool_calls"),
    (
        {
            "messages": [
                *OK,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": "{}"}}],
                },
            ]
        },
        "messages.1.tool_calls.0.id",
    ),
    (
        {
            "messages": [
                *OK,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": 5}}],
                },
            ]
        },
        "messages.1.tool_calls.0.function.arguments",
    ),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages.0.content.0",
    ),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
]


@pytest.mark.parametrize(("body", "param"), HOSTILE, ids=[p for _, p in HOSTILE])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_hostile_tool_bodies_are_400_naming_the_field_and_a_bystander_is_served(
    tiny_tools_server, body, param, stream
) -> None:
    full = {"model": "tiny", "messages": OK, "max_tokens": 2, **({"stream": True} if stream else {}), **body}
    if stream and param == "stream_options":
        full["stream"] = False  # stream_options with stream true is fine; false is the case under test
    r = httpx.post(tiny_tools_server.v1 + "/chat/completions", json=full, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"], error
    ok = httpx.post(
        tiny_tools_server.v1 + "/chat/completions", json={"model": "tiny", "messages": OK, "max_tokens": 2}, timeout=60
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_parallel_tool_calls_false_answers_one_call_when_auto_writes_two(tools_client, tiny_tools_server) -> None:
    """Under tool_choice "auto" nothing kept a model to one call: with parallel_tool_calls false a reply that wrote
    two came back with both, whole and streamed. The first is answered (a regex stands in for such a model: greedy,
    as under "auto" the regex joins the calls' grammar, which a sampled reply might take instead)."""
    two = '{"tool_calls": [{"name": "now", "arguments": {}}, {"name": "add", "arguments": {"a": 1, "b": 2}}]}'
    kw = {"tool_choice": "auto", "parallel_tool_calls": False, "max_tokens": 200, "temperature": 0}
    whole = _ask(tools_client, "two calls", **kw, extra_body={"regex": re.escape(two)}).choices[0]
    assert whole.finish_reason == "tool_calls" and [c.function.name for c in whole.message.tool_calls] == ["now"]
    body = {"model": "tiny", "messages": _messages("two calls"), "tools": TOOLS, **kw, "regex": re.escape(two)}
    chunks = _sse(tiny_tools_server, {**body, "stream": True})
    heads = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", ()) if "id" in tc]
    assert [tc["function"]["name"] for tc in heads] == ["now"] and chunks[-1]["choices"][0][
        "finish_reason"
    ] == "tool_calls"
