"""Tool calls parsed out of model output: the generic JSON format and Hermes tags; ids `call_` + 24 hex digits,
names checked against the tools, arguments the JSON text as written (validated here with jsonschema against the
tool's parameters); OpenAI-style streamed deltas (id, type and name on a call's first delta, then argument
pieces) whose assembly equals the non-streamed result for every chunking, including under a hypothesis fuzz of
arbitrary text; finish_reason "tool_calls"."""

from __future__ import annotations

import itertools
import json
import random
import re

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime.tools import ToolCallParser, assemble, parse_tool_calls

CANON = (
    '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}, '
    '{"name": "get_weather", "arguments": {"city": "Pa\\"ris}"}}]}'
)
OUTPUTS = {
    "generic": [
        CANON,
        '  {"tool_calls":[ {"name":"now","arguments":{}} ]}  trailing words',
        '{"tool_calls": [{"arguments": {"a": 1, "b": 2}, "name": "add"}]}',  # other key order: decided at the end
        '{"name": "add", "parameters": {"a": 1, "b": 2}}',  # a bare call
        ' [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]',  # Mistral's list
        "[1] a footnote, not a call",
        '{"tool_calls": [{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}]}',  # arguments as a string
        '{"tool_calls": [{"name": "rm_rf", "arguments": {}}]}',  # no such tool: text
        '{"answer": 42}',
        'The weather is fine. {"tool_calls": []}',
        '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b"',  # cut short
        '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "nope", "arguments": {}}]}',
        "",
        "plain text",
    ],
    "hermes": [
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"arguments": {}, "name": "now"}\n</tool_call>',
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call> and text <tool',
        '<tool_call>\n{"name": "add", "arguments": {"a": 1',
        "no calls at all < tool_call",
    ],
}


def counter_ids():
    n = itertools.count()
    return lambda: f"call_{next(n)}"


def streamed(text: str, specs, fmt: str, cuts: list[int]):
    parser = ToolCallParser(specs, fmt, new_id=counter_ids())
    deltas = []
    for a, b in itertools.pairwise([0, *cuts, len(text)]):
        deltas += parser.feed(text[a:b])
    deltas += parser.finish()
    return deltas, parser.result()


def as_openai(result):
    return result.content, [c.to_openai() for c in result.tool_calls]


@pytest.mark.parametrize(("fmt", "text"), [(f, t) for f, ts in OUTPUTS.items() for t in ts])
def test_streamed_deltas_assemble_to_the_whole_result(specs, fmt: str, text: str) -> None:
    whole = parse_tool_calls(text, specs, fmt, new_id=counter_ids())
    assert whole.raw == text
    rng = random.Random(text)
    for _ in range(12):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8)))) if len(text) > 1 else []
        deltas, result = streamed(text, specs, fmt, cuts)
        assert result == whole
        assert assemble(deltas) == as_openai(whole)
        seen = set()
        for d in deltas:
            for tc in d.get("tool_calls", ()):
                if tc["index"] not in seen:  # the first delta of a call: id, type, name
                    seen.add(tc["index"])
                    assert tc["id"] and tc["type"] == "function" and tc["function"]["name"]
                else:
                    assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
    one_char = streamed(text, specs, fmt, list(range(1, len(text))))
    assert assemble(one_char[0]) == as_openai(whole)


def test_generic_calls_validate_and_keep_their_text(specs) -> None:
    result = parse_tool_calls(CANON, specs)
    assert result.content is None and result.finish_reason("stop") == "tool_calls"
    assert result.finish_reason("length") == "length"
    assert [c.name for c in result.tool_calls] == ["add", "get_weather"]
    assert [c.arguments for c in result.tool_calls] == ['{"a": 1, "b": 2}', '{"city": "Pa\\"ris}"}']
    params = {t.name: t.parameters for t in specs}
    for call in result.tool_calls:
        assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
        jsonschema.validate(json.loads(call.arguments), params[call.name])
    assert len({c.id for c in result.tool_calls}) == 2
    message = result.message()
    assert message["content"] is None and message["tool_calls"][0]["function"]["arguments"] == '{"a": 1, "b": 2}'


@pytest.mark.parametrize("fmt", ["generic", "native"])
def test_a_list_of_calls_is_calls(specs, fmt: str) -> None:
    """Mistral's templates (read as "native") have the model write `[TOOL_CALLS]` (a special token, not in the text)
    then a JSON list of calls: the output starts with `[` and was content, so "auto" never gave a call."""
    text = '[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]'
    result = parse_tool_calls(text, specs, fmt)
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("add", {"a": 1, "b": 2}), ("now", {})]
    assert result.content is None and result.finish_reason("stop") == "tool_calls"
    for text in ["[1] a footnote", "[]", '[{"name": "rm_rf", "arguments": {}}]']:
        assert parse_tool_calls(text, specs, fmt).content == text


def test_what_is_not_a_call_is_content(specs) -> None:
    for text in ['{"tool_calls": [{"name": "rm_rf", "arguments": {}}]}', '{"answer": 42}', "hello", ""]:
        result = parse_tool_calls(text, specs)
        assert not result.tool_calls and result.content == (text or None)
        assert result.finish_reason("stop") == "stop"


DEEP = "[" * 5000 + "]" * 5000
ALMOST_CALLS = {
    "name-list": '{"tool_calls": [{"name": ["add"], "arguments": {}}]}',  # a name that is not a string
    "name-object": '{"tool_calls": [{"arguments": {}, "name": {"n": "add"}}]}',
    "deep": '{"tool_calls": [{"arguments": {"a": ' + DEEP + '}, "name": "add"}]}',  # past the recursion limit
    "deep-string": '{"name": "add", "arguments": "{\\"a\\": ' + DEEP + '}"}',  # the same, arguments as a string
    "braces": "{" * 3000,
}


@pytest.mark.parametrize("fmt", ["generic", "hermes"])
@pytest.mark.parametrize("body", ALMOST_CALLS.values(), ids=ALMOST_CALLS.keys())
def test_almost_a_call_is_content_never_an_error(specs, fmt: str, body: str) -> None:
    """Model output that nearly describes a call stayed an unhashable-name TypeError or a RecursionError out of
    the loose JSON reading, which failed the request with no word of what the model wrote."""
    text = body if fmt == "generic" else f"<tool_call>\n{body}\n</tool_call>"
    result = parse_tool_calls(text, specs, fmt)
    assert result.tool_calls == () and result.content == text


@pytest.mark.parametrize(
    "body",
    [
        '{"tool_calls": [{"arguments": {"a": NaN, "b": 1}, "name": "add"}]}',
        '{"arguments": "{\\"a\\": -Infinity}", "name": "add"}',
    ],
)
def test_arguments_holding_nan_or_infinity_are_not_a_call(specs, body: str) -> None:
    """Python's decoder reads NaN and Infinity, which are not JSON: a call read whole (its name after its arguments)
    carried them in its arguments to clients whose parsers refuse them. Such output is content."""
    result = parse_tool_calls(body, specs, "generic")
    assert result.tool_calls == () and result.content == body


def test_a_call_streams_its_name_before_its_arguments_end(specs) -> None:
    parser = ToolCallParser(specs, new_id=counter_ids())
    assert parser.feed('{"tool_calls": [{"name": "get_wea') == []
    head = parser.feed('ther", "arguments": {"ci')
    assert head[0]["tool_calls"][0] == {
        "index": 0,
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert head[1]["tool_calls"][0]["function"]["arguments"] == '{"ci'
    assert parser.feed('ty": "Oslo"}}]}') == [{"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}]


def test_plain_text_streams_at_once(specs) -> None:
    parser = ToolCallParser(specs)
    assert parser.feed("Hel") == [{"content": "Hel"}]
    hermes = ToolCallParser(specs, "hermes")
    assert hermes.feed("Hi <tool") == [{"content": "Hi "}]  # a tag may be starting: held back
    assert hermes.feed("box") == [{"content": "<toolbox"}]


def test_hermes_calls_and_content(specs) -> None:
    text = OUTPUTS["hermes"][0]
    result = parse_tool_calls(text, specs, "hermes")
    assert result.content == "Let me look.\n"
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("get_weather", '{"city": "Paris"}'), ("now", "{}")]
    bad = parse_tool_calls(OUTPUTS["hermes"][1], specs, "hermes")
    assert not bad.tool_calls and bad.content == OUTPUTS["hermes"][1]


def test_the_parser_refuses_input_after_finish(specs) -> None:
    parser = ToolCallParser(specs)
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("x")
    with pytest.raises(ValueError):
        ToolCallParser(specs, "xml")


ALPHABET = st.sampled_from([*'{}[]",: \n\\abc', '"tool_calls"', '"name"', '"arguments"', '"add"', "<tool_call>"])


@settings(max_examples=150, deadline=None)
@given(st.lists(ALPHABET, max_size=40), st.sampled_from(["generic", "hermes"]), st.randoms(use_true_random=False))
def test_any_text_parses_the_same_streamed_or_whole(specs, pieces, fmt, rng) -> None:
    text = "".join(pieces)
    whole = parse_tool_calls(text, specs, fmt, new_id=counter_ids())
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 5))) if len(text) > 1 else []
    deltas, result = streamed(text, specs, fmt, cuts)
    assert result == whole and assemble(deltas) == as_openai(whole)
    for call in whole.tool_calls:
        assert call.name in {"add", "get_weather", "now"}


def test_a_call_cut_short_is_not_finished_as_tool_calls(specs) -> None:
    """A stop string that ended the output inside a call's arguments gave finish_reason "tool_calls" beside
    arguments that are not JSON: a client runs the calls such a reply announces, and failed to read them."""
    for fmt, text in [
        ("generic", '{"tool_calls": [{"name": "add", "arguments": {"a": 1, '),
        ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 1'),
        ("generic", '{"tool_calls": [{"name": "now", "arguments": {}}, {"name": "add", "arguments": {"a"'),
    ]:
        result = parse_tool_calls(text, specs, fmt)
        assert result.tool_calls and not result.complete
        with pytest.raises(json.JSONDecodeError):
            json.loads(result.tool_calls[-1].arguments)
        assert result.finish_reason("stop") == "stop" and result.finish_reason("length") == "length"
    whole = parse_tool_calls('{"tool_calls": [{"name": "now", "arguments": {}}', specs)  # the list left open
    assert whole.complete and whole.finish_reason("stop") == "tool_calls"


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("generic", '{"tool_calls": [{"name": "add", "arguments": {"a": NaN, "b": 1}}]}'),
        ("generic", '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2,}}]}'),
        ("generic", '{"tool_calls": [{"name": "now", "arguments": {}}, {"name": "add", "arguments": {a: 1}}]}'),
        ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": Infinity}}\n</tool_call>'),
    ],
)
def test_a_call_whose_arguments_are_no_json_is_not_finished_as_tool_calls(specs, fmt: str, text: str) -> None:
    """Arguments that closed but are not JSON (NaN, a trailing comma, a bare key: an unconstrained model's slip),
    streamed as the model wrote them, gave finish_reason "tool_calls": a client runs the calls such a reply
    announces, and failed to read them (the loose reading refuses NaN, the streamed one took it)."""
    result = parse_tool_calls(text, specs, fmt)
    assert result.tool_calls and not result.complete
    with pytest.raises(ValueError):  # RFC 8259 JSON: NaN and Infinity refused too
        json.loads(result.tool_calls[-1].arguments, parse_constant=lambda c: int(c))
    assert result.finish_reason("stop") == "stop"


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("generic", '{"tool_calls": [{"name": "now", "arguments": {}}, {"name": "add", "arguments": {"a": 1}}]}'),
        ("generic", '{"tool_calls": [{"arguments": {}, "name": "now"}, {"name": "add", "arguments": {"a": 1}}]}'),
        ("hermes", '<tool_call>{"name": "now", "arguments": {}}</tool_call>\n<tool_call>{"name": "add"'),
        ("hermes", 'Hi.<tool_call>{"arguments": {}, "name": "now"}</tool_call><tool_call>{"name": "now"}'),
    ],
)
def test_max_calls_keeps_the_first_call_streamed_or_whole(specs, fmt: str, text: str) -> None:
    """`parallel_tool_calls: false` is `max_calls=1`: an unconstrained model that writes two calls gives the first
    (the rest stays in `raw`), streamed as whole."""
    whole = parse_tool_calls(text, specs, fmt, new_id=counter_ids(), max_calls=1)
    assert [c.name for c in whole.tool_calls] == ["now"] and whole.raw == text
    parser = ToolCallParser(specs, fmt, new_id=counter_ids(), max_calls=1)
    deltas = [d for i in range(len(text)) for d in parser.feed(text[i])] + parser.finish()
    assert assemble(deltas) == as_openai(whole)
    assert whole.dropped_calls and parser.result().dropped_calls  # the second call was left out
    assert not parse_tool_calls(text, specs, fmt, new_id=counter_ids(), max_calls=2).dropped_calls
