"""Tools through the Python API (tiny checkpoint: ChatML without tools, so the generic format; random weights, so
only the grammar makes calls): tool_choice "required" and named give calls that validate against their tools'
schemas (jsonschema), one call at most without parallel_tool_calls; "none" parses nothing; the result's text is the
content outside the calls and finish_reason "tool_calls"; a stream's deltas assemble to the same calls as the
whole result; an agent loop replayed as OpenAI clients send it (assistant tool_calls with null content, tool turns,
developer, names) extends each prompt token for token and hits the previous prompt and output's whole pages; a
Session keeps tool calls in its history; bad tools and messages are clear errors naming the field."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import jsonschema
import pytest

from radixcache.runtime import Engine
from radixcache.runtime.grammar import GrammarError, GrammarSpec
from radixcache.runtime.tools import assemble
from tests.runtime.structured.conftest import PAGE, TOOL_SCHEMAS, TOOLS

ONE_CALL: dict[str, Any] = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
ASK = [{"role": "developer", "content": "Use the tools."}, {"role": "user", "content": "What is 2 + 3?", "name": "ann"}]


def check_calls(result: Any, names: set[str] | None = None) -> None:
    assert result.finish_reason == "tool_calls" and result.tool_calls, result
    for call in result.tool_calls:
        assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
        assert names is None or call.name in names
        jsonschema.validate(json.loads(call.arguments), TOOL_SCHEMAS[call.name])


def test_required_gives_calls_that_validate(engine: Engine) -> None:
    for seed in range(6):
        r = engine.chat(ASK, 200, **ONE_CALL, temperature=1.0, seed=seed)
        check_calls(r)
        assert r.text == ""  # the output is only calls: OpenAI's content null


def test_parallel_calls_each_validate(engine: Engine) -> None:
    # The random model rarely closes the list of calls: every call but a last one cut at the length validates.
    for seed in range(3):
        r = engine.chat(ASK, 300, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed)
        assert r.tool_calls and r.finish_reason in ("tool_calls", "length")
        done = r.tool_calls if r.finish_reason == "tool_calls" else r.tool_calls[:-1]
        for call in done:
            jsonschema.validate(json.loads(call.arguments), TOOL_SCHEMAS[call.name])


def test_a_named_choice_calls_that_tool_and_parallel_false_one_call(engine: Engine) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    for seed in range(4):
        r = engine.chat(ASK, 200, tools=TOOLS, tool_choice=named, temperature=1.2, seed=seed, parallel_tool_calls=False)
        check_calls(r, {"add"})
        assert len(r.tool_calls) == 1


def test_none_shows_the_tools_but_parses_nothing(engine: Engine) -> None:
    auto = engine.chat(ASK, 1, tools=TOOLS)
    none = engine.chat(ASK, 20, tools=TOOLS, tool_choice="none", ignore_eos=True)
    assert none.tool_calls == () and none.finish_reason == "length"
    assert none.prompt_tokens == auto.prompt_tokens  # the same prompt: switching tool_choice keeps the cache
    assert none.prompt_tokens > engine.chat(ASK, 1).prompt_tokens


def test_stream_deltas_assemble_to_the_calls_of_the_whole_result(engine: Engine) -> None:
    kw = ONE_CALL

    async def deltas() -> list[dict[str, Any]]:
        return [d async for d in engine.stream(ASK, 200, **kw)]

    streamed = asyncio.run(deltas())
    assert all(set(d) <= {"content", "tool_calls"} for d in streamed)
    content, calls = assemble(streamed)
    whole = engine.chat(ASK, 200, **kw)
    assert content is None and whole.text == ""
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        (c.name, c.arguments) for c in whole.tool_calls
    ]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c["id"]) for c in calls)


def test_an_agent_loop_extends_each_prompt_and_hits_its_whole_pages(engine: Engine) -> None:
    messages: list[dict[str, Any]] = [*ASK]
    previous: tuple[list[int], Any] | None = None
    for step in range(3):
        r = engine.chat(messages, 200, **ONE_CALL, temperature=0.9, seed=step)
        check_calls(r)
        prompt = engine.tokenizer.encode(engine._builder.render(messages, _tool_use()))
        assert len(prompt) == r.prompt_tokens
        if previous is not None:
            before, out = previous
            computed = before + list(out.token_ids)
            assert prompt[: len(computed)] == computed  # token for token: prompt N+1 extends prompt N + output N
            assert r.cached_tokens >= (len(computed) - 1) // PAGE * PAGE  # the KV of all but the last token
        previous = (prompt, r)
        calls = [c.to_openai() for c in r.tool_calls]
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})  # as OpenAI clients replay
        messages += [{"role": "tool", "tool_call_id": c.id, "content": f"result {step}"} for c in r.tool_calls]
    final = engine.chat(messages, 8, tools=TOOLS, tool_choice="none")
    assert final.tool_calls == () and final.cached_tokens >= (r.prompt_tokens + len(r.token_ids) - 1) // PAGE * PAGE


def _tool_use() -> Any:
    from radixcache.runtime.tools import ToolUse

    return ToolUse.of(TOOLS, "required", False)


def test_a_session_keeps_tool_calls_in_its_history(engine: Engine) -> None:
    s = engine.session(system="Use the tools.", **ONE_CALL, max_new_tokens=200, seed=1)
    r = s.send("What is 2 + 3?")
    check_calls(r)
    assert s.messages[-1] == {"role": "assistant", "content": None, "tool_calls": [c.to_openai() for c in r.tool_calls]}
    r2 = s.send_tool_results({c.id: "5" for c in r.tool_calls}, tool_choice="auto", max_new_tokens=6)
    assert [m["role"] for m in s.messages[-len(r.tool_calls) - 1 :]] == ["tool"] * len(r.tool_calls) + ["assistant"]
    assert r2.cached_tokens >= (r.prompt_tokens + len(r.token_ids) - 1) // PAGE * PAGE


def test_a_session_whose_reply_is_cut_inside_a_call_goes_on_from_what_the_model_wrote(engine: Engine) -> None:
    """A reply cut by max_new_tokens inside a call's arguments (finish_reason "length", the arguments unfinished):
    the session kept the unfinished call in its history once, and every later turn failed to render it; then it
    dropped the call (the history kept an empty reply), so the next prompt lacked what the model wrote and the cache
    missed the reply. It keeps the call as the result has it, as a client replaying the reply sends it."""
    s = engine.session(system="Use the tools.", **ONE_CALL, max_new_tokens=60, seed=1)
    r = s.send("What is 2 + 3?")
    assert r.finish_reason == "length" and r.tool_calls, r
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.tool_calls[-1].arguments)
    assert s.messages[-1] == {"role": "assistant", "content": None, "tool_calls": [c.to_openai() for c in r.tool_calls]}
    history = [*s.messages, {"role": "user", "content": "Again."}]
    r2 = s.send("Again.", tool_choice="none", max_new_tokens=6)
    assert r2.cached_tokens >= (r.prompt_tokens + len(r.token_ids) - 1) // PAGE * PAGE  # the reply's pages too
    assert r2.token_ids == engine.chat(history, 6, **ONE_CALL | {"tool_choice": "none"}, seed=1).token_ids
    assert len(s.messages) == 5


def test_a_session_keeps_a_call_whose_arguments_hold_nan_as_written(engine: Engine) -> None:
    """Arguments with NaN are no JSON to the tool-call parser (the reply finishes "stop"); the session keeps the call
    as the result has it (text, not a number), and the next prompt holds the reply as the model wrote it."""
    text = '{"tool_calls": [{"name": "add", "arguments": {"a": NaN, "b": 1}}]}'
    s = engine.session(system="Use the tools.", tools=TOOLS, tool_choice="auto", max_new_tokens=80)
    r = s.send("What is 2 + 3?", grammar=GrammarSpec.regex(re.escape(text)))
    assert r.finish_reason == "stop" and [c.arguments for c in r.tool_calls] == ['{"a": NaN, "b": 1}'], r
    assert s.messages[-1]["tool_calls"] == [c.to_openai() for c in r.tool_calls]
    r2 = s.send("Again.", max_new_tokens=1)
    assert r2.cached_tokens >= (r.prompt_tokens + len(r.token_ids) - 1) // PAGE * PAGE


def test_achat_takes_tools(engine: Engine) -> None:
    r = asyncio.run(engine.achat(ASK, 200, **ONE_CALL, seed=2, temperature=1.0))
    check_calls(r)


@pytest.mark.parametrize(
    ("kwargs", "error", "where"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, ValueError, "tools[0].function.name"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            ValueError,
            "tool_choice",
        ),
        ({"tool_choice": "required"}, ValueError, "tool_choice"),
        ({"tools": TOOLS, "parallel_tool_calls": "yes"}, ValueError, "parallel_tool_calls"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"properties": {"x": {"type": "integr"}}}},
                    }
                ],
                "tool_choice": "required",
            },
            GrammarError,
            "tools[0].function.parameters.properties.x.type",
        ),
    ],
)
def test_bad_tools_are_clear_errors(engine: Engine, kwargs: dict[str, Any], error: type, where: str) -> None:
    with pytest.raises(error, match=re.escape(where)):
        engine.chat(ASK, 4, **kwargs)


def test_bad_messages_name_the_field(engine: Engine) -> None:
    with pytest.raises(ValueError, match=re.escape("messages[1].content")):
        engine.chat([{"role": "system", "content": "s"}, {"role": "user", "content": None}], 4)
    with pytest.raises(ValueError, match=re.escape("messages[0].tool_call_id")):
        engine.chat([{"role": "tool", "content": "x"}], 4)
    r = engine.chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}, *ASK[1:]], 4)
    assert r.finish_reason in ("stop", "length")


def test_auto_with_a_json_schema_answers_in_the_schema_or_calls_a_tool(engine: Engine) -> None:
    from tests.runtime.structured.conftest import SCHEMAS, response_format

    kinds = set()
    for seed in range(8):
        r = engine.chat(ASK, 200, tools=TOOLS, tool_choice="auto", response_format=response_format("flags"),
                        parallel_tool_calls=False, temperature=1.0, seed=seed)  # fmt: skip
        if r.tool_calls:
            check_calls(r)
            kinds.add("call")
        else:
            assert r.finish_reason == "stop", r
            jsonschema.validate(json.loads(r.text), SCHEMAS["flags"])
            kinds.add("answer")
    assert kinds  # which of the two a random model picks is its own business; each is valid


def test_a_call_whose_arguments_are_nested_past_the_decoder_is_kept_as_text(engine: Engine) -> None:
    """A streamed call's arguments are not decoded as they arrive, so arguments nested past Python's recursion limit
    reached the session, whose check of them raised RecursionError and failed the turn after it had run. The call
    is kept as written, and the next turn renders it as text."""
    from types import SimpleNamespace

    from radixcache.runtime.tools.messages import ToolCall

    s = engine.session(system="Use the tools.")
    deep = '{"a": ' + "[" * 5000 + "]" * 5000 + "}"
    reply = SimpleNamespace(tool_calls=(ToolCall("call_1", "add", deep),), text="calling")
    s._append([], reply)  # type: ignore[arg-type]
    (call,) = reply.tool_calls
    assert s.messages[-1] == {"role": "assistant", "content": "calling", "tool_calls": [call.to_openai()]}
    assert deep in engine._builder.render([*s.messages, {"role": "user", "content": "Go on."}], _tool_use())


def test_a_replayed_call_whose_content_was_edited_renders_that_content(engine: Engine) -> None:
    """The memory of the text the model wrote matched a replayed message by its calls only, so an assistant message
    whose content the client had edited (a note beside the calls) rendered as the model's own text: the content was
    dropped from the prompt without a word. Unedited, the replay is still the model's text (and the cache's)."""
    r = engine.chat(ASK, 200, **ONE_CALL, seed=2)
    check_calls(r)
    calls = [c.to_openai() for c in r.tool_calls]
    edited = [*ASK, {"role": "assistant", "content": "Checking the sum.", "tool_calls": calls}]
    prompt = engine._builder.render(edited, _tool_use())
    fresh = engine.tokenizer.apply_chat_template(edited, tools=_tool_use().tools)  # rendered without any memory
    assert "Checking the sum." in prompt and prompt == fresh
    replayed = engine._builder.render([*ASK, {"role": "assistant", "content": None, "tool_calls": calls}], _tool_use())
    raw = engine.tool_memory.lookup(r.tool_calls)
    assert raw is not None and replayed.startswith(engine._builder.render(ASK, _tool_use()) + raw)


def test_a_stop_string_inside_a_required_call_does_not_cut_it(engine: Engine) -> None:
    """A stop string matched inside a call's arguments cut them short (not JSON) with finish_reason "stop", though a
    named tool_choice runs under the calls' grammar, whose output "stop" should mean whole. A stop string ends a
    grammar's output only where it is complete: the call's arguments are whole JSON, and a session keeps it."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    kw: dict[str, Any] = {"tools": TOOLS, "tool_choice": named, "parallel_tool_calls": False, "stop": ['"unit"']}
    r = engine.chat(ASK, 200, **kw)
    assert r.tool_calls and r.tool_calls[0].name == "get_weather", r
    check_calls(r, {"get_weather"})  # its arguments hold "unit": the stop string was written, not obeyed
    s = engine.session(**kw, max_new_tokens=200)
    r = s.send(ASK[1]["content"])
    check_calls(r, {"get_weather"})
    assert r.finish_reason == "tool_calls" and s.messages[-1]["tool_calls"] == [c.to_openai() for c in r.tool_calls]


def test_a_turn_that_gives_new_tools_keeps_the_sessions_tool_choice(engine: Engine) -> None:
    """A session's tool_choice "required" fell back to "auto" on a turn that gave other tools (its tool_choice a
    default like any other, kept when the turn does not give it): the reply was then free text. A named choice
    stays while the new tools have that function, and falls back to their default when they do not."""
    s = engine.session(system="Use the tools.", **ONE_CALL, max_new_tokens=200, seed=1)
    r = s.send("What is 2 + 3?", tools=TOOLS[1:])
    check_calls(r, {"add", "now"})
    named = {"type": "function", "function": {"name": "add"}}
    s = engine.session(tools=TOOLS, tool_choice=named, parallel_tool_calls=False, max_new_tokens=200, seed=2)
    check_calls(s.send("What is 2 + 3?", tools=TOOLS[1:]), {"add"})
    assert s.options.updated(tools=TOOLS[2:]).tool_use.choice.mode == "auto"  # "add" is not among them
    assert s.options.updated(tools=None).tool_use is None


def test_null_tool_fields_count_as_absent_in_python_too(engine: Engine) -> None:
    """The server took `"description": null` and `"strict": null` as absent, the Python API refused them ("must be
    a string"), so the same tools worked over HTTP and failed in `Engine.chat`: a description taken from an
    undocumented function's `__doc__` is None."""
    nulls = [{"type": None, "function": {**t["function"], "description": None, "strict": None}} for t in TOOLS]
    dropped = ("description", "strict")
    plain = [{"function": {k: v for k, v in t["function"].items() if k not in dropped}} for t in TOOLS]
    r = engine.chat(ASK, 200, tools=nulls, tool_choice="required", parallel_tool_calls=False, seed=3)
    check_calls(r)
    assert engine._builder.render(ASK, _use(nulls)) == engine._builder.render(ASK, _use(plain))


def _use(tools: list[dict[str, Any]]) -> Any:
    from radixcache.runtime.tools import ToolUse

    return ToolUse.of(tools, "required", False)


@pytest.mark.parametrize("field", ["default", "enum", "properties"])
def test_a_parameter_named_like_a_keyword_is_closed_like_the_others(field: str) -> None:
    """The grammar closes every object with `properties` to other keys (a small model left free adds keys without
    end), but closed_objects read property names as keywords: an object parameter called `default` or `enum` was
    left open, and a `properties` map holding a field called `properties` gained a field `additionalProperties`."""
    from radixcache.runtime.engine.options import RequestOptions
    from radixcache.runtime.engine.tool_calls import request_grammar
    from radixcache.runtime.tools import TemplateFeatures

    inner = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    params = {"type": "object", "properties": {field: inner}, "required": [field]}
    tool = {"type": "function", "function": {"name": "configure", "parameters": params}}
    options = RequestOptions.of(8, tools=[tool], tool_choice="required", parallel_tool_calls=False)
    schema = request_grammar(options, TemplateFeatures()).schema()
    arguments = schema["properties"]["tool_calls"]["items"]["properties"]["arguments"]
    assert set(arguments["properties"]) == {field}  # a map of names: no field added to it

    def call(arguments: dict[str, Any]) -> dict[str, Any]:
        return {"tool_calls": [{"name": "configure", "arguments": arguments}]}

    jsonschema.validate(call({field: {"a": 1}}), schema)
    for extra in ({field: {"a": 1, "b": 2}}, {field: {"a": 1}, "other": 3}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(call(extra), schema)


@pytest.mark.parametrize("choice", ["auto", "none", {"type": "function", "function": {"name": "add"}}])
def test_a_bad_parameters_schema_is_refused_whatever_the_choice(engine: Engine, choice: Any) -> None:
    """The server refuses a tool whose parameters are not a valid schema whatever the tool_choice; the Python API
    checked only the tools a grammar enforced ("required", a named one), so under "auto" or "none" the same
    request ran with the broken schema shown to the model, and under a named choice another tool's went unseen."""
    broken = {"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {"type": "integr"}}}}}
    with pytest.raises(GrammarError, match=re.escape("tools[3].function.parameters.properties.x.type")):
        engine.chat(ASK, 4, tools=[*TOOLS, broken], tool_choice=choice)
    assert engine.chat(ASK, 2, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False).prompt_tokens > 0


def test_parallel_tool_calls_false_gives_one_call_when_auto_writes_two(engine: Engine) -> None:
    """parallel_tool_calls=False was enforced only by the grammar of "required" and named choices: under "auto" a
    model that wrote two calls gave both, in the result and the stream, though the request allowed one at most
    (as OpenAI guarantees). The first is kept; with parallel calls allowed both are. A regex stands in for a model
    that writes two calls."""
    from radixcache.runtime.grammar import GrammarSpec

    two = '{"tool_calls": [{"name": "now", "arguments": {}}, {"name": "add", "arguments": {"a": 1, "b": 2}}]}'
    kw: dict[str, Any] = {"tools": TOOLS, "tool_choice": "auto", "grammar": GrammarSpec.regex(re.escape(two))}

    async def streamed(parallel: bool) -> list[dict[str, Any]]:
        return [d async for d in engine.stream(ASK, 200, **kw, parallel_tool_calls=parallel)]

    for parallel, names in ((False, ["now"]), (True, ["now", "add"])):
        r = engine.chat(ASK, 200, **kw, parallel_tool_calls=parallel)
        assert r.finish_reason == "tool_calls" and [c.name for c in r.tool_calls] == names, r
        assert [c["function"]["name"] for c in assemble(asyncio.run(streamed(parallel)))[1]] == names
        # The text the model wrote holds a call the caller never saw when one was dropped: it is not remembered as
        # the text of the one returned, so the next turn's prompt shows the history the caller sends back.
        remembered = engine.tool_memory.lookup(r.tool_calls, r.text)
        assert (remembered is None) == (not parallel), remembered


@pytest.mark.parametrize("strict", [False, True])
def test_auto_with_the_schema_true_answers_any_json_value_or_calls_a_tool(engine: Engine, strict: bool) -> None:
    """JSON Schema's `true` (any value) as the answer's schema beside tools under "auto": the lenient answer was
    built as `{"x-guidance": ..., **schema}`, a TypeError out of the engine (a 500 from the server). Now the answer is
    any JSON value, or a call; `false` is a GrammarError."""
    body = {"type": "json_schema", "json_schema": {"name": "any", "schema": True, "strict": strict}}
    for seed in range(3):
        r = engine.chat(ASK, 120, tools=TOOLS, tool_choice="auto", response_format=body,
                        parallel_tool_calls=False, temperature=1.0, seed=seed)  # fmt: skip
        if r.tool_calls:
            check_calls(r)
        elif r.finish_reason == "stop":  # a random model may write a long value: cut at the length, it is no JSON yet
            json.loads(r.text)
    body["json_schema"]["schema"] = False
    with pytest.raises(GrammarError, match="the schema false admits no value"):
        engine.chat(ASK, 8, tools=TOOLS, tool_choice="auto", response_format=body)
    assert engine.check()["locked_blocks"] == 0


def test_auto_with_a_lenient_json_schema_answers_in_compact_json(engine: Engine) -> None:
    """A response_format without `strict` (OpenAI's default: false) beside tools under "auto": the answer's lenient
    option replaced the compact separators in its `%json` rule, so the answer could put any whitespace between
    tokens, and the random model wrote newlines and tabs until its length. Lenient answers are compact too."""
    from tests.runtime.structured.conftest import SCHEMAS
    from tests.tiny_tools import closed

    body = {"type": "json_schema", "json_schema": {"name": "flags", "schema": closed(SCHEMAS["flags"])}}
    answers = 0
    for seed in range(6):
        r = engine.chat(ASK, 200, tools=TOOLS, tool_choice="auto", response_format=body,
                        parallel_tool_calls=False, temperature=1.0, seed=seed)  # fmt: skip
        if r.tool_calls:
            continue
        answers += 1
        assert r.finish_reason == "stop", r
        value = json.loads(r.text)
        assert r.text == json.dumps(value, ensure_ascii=False), r.text  # `, ` and `: `, no other whitespace
    assert answers
