"""Call arguments holding an integer of more than 4,300 digits (JSON has no bound; Python's int() refuses them with a
ValueError) or arrays nested thousands deep (past Python's JSON decoder, a RecursionError). A model's call with such
an integer was parsed but its reply finished "stop", not "tool_calls" (the check that its arguments closed as a JSON
object converted the digits), so it counted as a call cut short; a call in the loose forms re-serialised a number
past the doubles as `Infinity`, which no JSON parser reads. Each is now a clean result: the arguments as the model
wrote them, and the next prompt extends the cached one token for token (the memory compares them as their text)."""

from __future__ import annotations

import json

import pytest

from radixcache.runtime.tools import ToolCallMemory, ToolCallParser, assemble, parse_tool_calls
from tests.runtime.tools.test_prefix import HERMES, agent_loop, assert_each_step_extends_the_last

BIG = "9" * 5000  # past sys.get_int_max_str_digits() (4,300)
DEEP = "[" * 3000 + "]" * 3000  # past the decoder's recursion
BIG_ARGS = '{"a": ' + BIG + ', "b": -' + BIG + "}"
DEEP_ARGS = '{"a": ' + DEEP + ', "b": 2}'


def outputs(fmt: str, arguments: str) -> str:
    call = '{"name": "add", "arguments": ' + arguments + "}"
    return f"<tool_call>\n{call}\n</tool_call>" if fmt == "hermes" else '{"tool_calls": [' + call + "]}"


def streamed(text: str, specs, fmt: str) -> tuple[str | None, list[dict]]:
    parser = ToolCallParser(specs, fmt)
    deltas = [d for i in range(0, len(text), 7) for d in parser.feed(text[i : i + 7])]
    return assemble([*deltas, *parser.finish()])


@pytest.mark.parametrize("fmt", ["generic", "native", "hermes"])
def test_a_call_with_a_5000_digit_integer_is_a_whole_call(specs, fmt: str) -> None:
    text = outputs(fmt, BIG_ARGS)
    parsed = parse_tool_calls(text, specs, fmt)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("add", BIG_ARGS)]
    assert parsed.finish_reason("stop") == "tool_calls"  # "stop" before: its arguments counted as no JSON
    content, calls = streamed(text, specs, fmt)
    assert content is None and [c["function"]["arguments"] for c in calls] == [BIG_ARGS]
    json.dumps(parsed.message())  # what the server sends: text


@pytest.mark.parametrize("fmt", ["generic", "native", "hermes"])
def test_arguments_nested_past_the_decoder_are_kept_as_written(specs, fmt: str) -> None:
    parsed = parse_tool_calls(outputs(fmt, DEEP_ARGS), specs, fmt)
    assert [c.arguments for c in parsed.tool_calls] == [DEEP_ARGS]
    # JSON, but none Python can read whole: the call is not known to be whole (docs/tool_calls.md)
    assert parsed.finish_reason("stop") == "stop"


@pytest.mark.parametrize(
    "text",
    [
        '{"arguments": {"a": 1e999, "b": 2}, "name": "add"}',  # keys in another order: read once the output ends
        '[{"name": "add", "arguments": {"a": ' + BIG + '.5, "b": 2}}]',
        '[{"name": "add", "arguments": "{\\"a\\": 1e999, \\"b\\": 2}"}]',  # arguments as a string
        '{"name": "add", "arguments": {"a": ' + BIG + ', "b": 2}}',
        '{"name": "add", "arguments": {"a": ' + DEEP + ', "b": 2}}',
    ],
    ids=["reordered-1e999", "big-float", "string-1e999", "big-int", "deep"],
)
def test_loose_calls_whose_numbers_json_cannot_write_back_stay_content(specs, text: str) -> None:
    """The loose forms re-serialise the arguments: 1e999 was written `Infinity` (the call's arguments no JSON)."""
    parsed = parse_tool_calls(text, specs, "generic")
    assert not parsed.tool_calls and parsed.content == text
    assert streamed(text, specs, "generic") == (text, [])


@pytest.mark.parametrize("arguments", [BIG_ARGS, DEEP_ARGS], ids=["big", "deep"])
@pytest.mark.parametrize("template", [None, HERMES], ids=["generic", "hermes"])
def test_the_next_prompt_extends_the_cached_one(tiny_tokenizer, specs, arguments: str, template) -> None:
    fmt = "hermes" if template else "generic"
    steps = agent_loop(
        tiny_tokenizer, specs, [outputs(fmt, arguments)], memory=ToolCallMemory(), chat_template=template
    )
    assert_each_step_extends_the_last(steps)
