"""A call in a shape the parser reads only whole (Mistral's list after `[TOOL_CALLS]`, Llama 3's bare `{"name": ...,
"parameters": {...}}`, a Hermes tag's JSON in that shape) that the length limit cut inside its arguments was returned
as content (or, under "required", nothing): OpenAI returns the call, its arguments as written so far, at
finish_reason "length". Now it is that call, whole and streamed alike; other cut JSON stays content."""

from __future__ import annotations

import pytest

from radixcache.runtime.tools import ToolCallParser, assemble, normalize_tools, parse_tool_calls
from tests.tiny_tools import TOOLS


@pytest.mark.parametrize("choice", [False, True])
@pytest.mark.parametrize(
    ("fmt", "text", "arguments"),
    [
        ("generic", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2', '{"a": 2'),  # Mistral
        ("generic", '[TOOL_CALLS] [{"name": "add", "arguments": ', ""),
        ("native", '{"name": "add", "parameters": {"a": 2, "b', '{"a": 2, "b'),  # Llama 3's JSON
        ("native", '{"name": "add"', ""),
        ("hermes", '<tool_call>\n{"name": "add", "parameters": {"a": ', '{"a": '),
    ],
)
def test_a_call_in_a_shape_read_whole_is_a_call_when_cut(fmt: str, text: str, arguments: str, choice: bool) -> None:
    specs = normalize_tools(TOOLS)
    whole = parse_tool_calls(text, specs, fmt, calls_only=choice)
    assert (whole.content, [(c.name, c.arguments) for c in whole.tool_calls]) == (None, [("add", arguments)])
    assert whole.finish_reason("length") == "length" and whole.raw == text
    parser = ToolCallParser(specs, fmt, calls_only=choice)
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()
    content, calls = assemble(deltas)
    assert (content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls]) == (
        None,
        [("add", arguments)],
    )


@pytest.mark.parametrize(
    "text",
    [
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2}}, {"na',  # a whole call, then a cut list: not one call
        '{"name": "nope", "parameters": {"a": 2',  # no tool of that name
        '{"name": "add", "parameters": 7',  # arguments no object
        "[1, 2",
    ],
)
def test_other_cut_json_stays_content(text: str) -> None:
    assert parse_tool_calls(text, normalize_tools(TOOLS), "generic").content == text
