"""Cohere's tool-call formats: detected from the chat template (Command-R / R+ `Action:` with `tool_name`, Command
R7B `<|START_ACTION|>`), and parsed out of the model's text, whole and streamed: the calls each output holds (by an
independent reading of the JSON list, compared with what the parser gives), content outside them, OpenAI deltas that
assemble to the whole result for every chunking (and under a hypothesis fuzz), a block in another shape held and read
whole, text that is no call kept as content, a call cut short, `max_calls` and `calls_only`; R7B's action markers are
kept in the decoded text where the tokenizer has them as special tokens."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime.tools import ToolCallParser, assemble, parse_tool_calls, template_features
from radixcache.runtime.tools.call_tokens import call_token_ids
from tests.command_r_templates import COMMAND_R, COMMAND_R7B
from tests.runtime.tools.test_parse import as_openai, counter_ids, streamed
from tests.runtime.tools.test_prefix import HERMES

R_CALLS = '[\n    {\n        "tool_name": "get_weather",\n        "parameters": {"city": "Pa\\"ris]```"}\n    },\n' \
    '    {"tool_name": "now", "parameters": {}}\n]'  # fmt: skip
R7B_CALLS = '[{"tool_call_id": "0", "tool_name": "add", "parameters": {"a": 1, "b": 2}}, ' \
    '{"tool_call_id": "1", "tool_name": "get_weather", "parameters": {"city": "Oslo"}}]'  # fmt: skip
# (output, content, calls as (name, arguments value)): the expectation is read from the list by json, not the parser
CASES = {
    "command_r": [
        (f"I will look it up.\nAction: ```json\n{R_CALLS}\n```", "I will look it up.\n", json.loads(R_CALLS)),
        (f"Action: {R_CALLS}", None, json.loads(R_CALLS)),  # no fence
        (
            'Action:```\n[{"parameters": {"a": 1, "b": 2}, "tool_name": "add"}]\n```',
            None,  # other key order
            [{"tool_name": "add", "parameters": {"a": 1, "b": 2}}],
        ),
        ('Action: ```json\n[{"name": "now", "arguments": "{}"}]\n```', None, [{"tool_name": "now", "parameters": {}}]),
        ("Action: none needed, the answer is 4.", "Action: none needed, the answer is 4.", []),
        (
            'Action: ```json\n[{"tool_name": "directly_answer", "parameters": {}}]\n```',
            'Action: ```json\n[{"tool_name": "directly_answer", "parameters": {}}]\n```',
            [],
        ),  # no such tool
        ("The answer is 4.", "The answer is 4.", []),
        ("", None, []),
    ],
    "command_r7b": [
        (
            f"I will add, then look.<|START_ACTION|>{R7B_CALLS}<|END_ACTION|>",
            "I will add, then look.",
            json.loads(R7B_CALLS),
        ),
        (
            '<|START_ACTION|>\n[\n    {"tool_name": "now", "tool_call_id": "0", "parameters": {}}\n]<|END_ACTION|>',
            None,
            [{"tool_name": "now", "parameters": {}}],
        ),  # other key order
        (
            '<|START_ACTION|>{"tool_name": "now", "parameters": {}}<|END_ACTION|> Done.',
            "Done.",
            [{"tool_name": "now", "parameters": {}}],
        ),  # one call, no list
        ("<|START_ACTION|>no json<|END_ACTION|>", "<|START_ACTION|>no json<|END_ACTION|>", []),
        ("Action: is R and R+'s, not R7B's", "Action: is R and R+'s, not R7B's", []),
        ("It is 4.", "It is 4.", []),
        # R7B's thinking and response markers, where a tokenizer shows them as text: no content
        (
            f"<|START_THINKING|>I will add.<|END_THINKING|><|START_ACTION|>{R7B_CALLS}<|END_ACTION|>",
            "I will add.",
            json.loads(R7B_CALLS),
        ),
        ("<|START_RESPONSE|>It is 4 <|END_RESPONSE|>", "It is 4 ", []),
        ("<|START_RESPONSE|>a <|x|> b<|END_RES", "a <|x|> b<|END_RES", []),  # cut inside a marker: the rest shows
    ],
}
FLAT = [(fmt, *case) for fmt, cases in CASES.items() for case in cases]


def test_the_format_is_read_from_the_template() -> None:
    assert template_features(COMMAND_R).format == "command_r"
    assert template_features(COMMAND_R7B).format == "command_r7b"
    assert template_features(HERMES).format == "hermes"
    no_tools = COMMAND_R.replace("tools", "things")  # a template that does not render tools: the generic format
    assert template_features(no_tools).format == "generic"


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), FLAT)
def test_calls_and_content_are_what_the_output_holds(specs, fmt, text, content, calls) -> None:
    whole = parse_tool_calls(text, specs, fmt, new_id=counter_ids())
    assert whole.raw == text and whole.content == content
    got = [(c.name, json.loads(c.arguments)) for c in whole.tool_calls]
    assert got == [(c["tool_name"], c["parameters"]) for c in calls]
    assert [c.id for c in whole.tool_calls] == [f"call_{i}" for i in range(len(calls))]  # the model's index dropped
    assert whole.finish_reason("stop") == ("tool_calls" if calls else "stop")


@pytest.mark.parametrize(("fmt", "text"), [(fmt, text) for fmt, text, _, _ in FLAT])
def test_streamed_deltas_assemble_to_the_whole_result(specs, fmt: str, text: str) -> None:
    whole = parse_tool_calls(text, specs, fmt, new_id=counter_ids())
    rng = random.Random(text)
    for cuts in [list(range(1, len(text)))] + [
        sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8)))) for _ in range(10)
    ] if len(text) > 1 else [[]]:  # fmt: skip
        deltas, result = streamed(text, specs, fmt, cuts)
        assert result == whole and assemble(deltas) == as_openai(whole)


def test_arguments_stream_before_the_block_closes(specs) -> None:
    parser = ToolCallParser(specs, "command_r", new_id=counter_ids())
    deltas = parser.feed('Action: ```json\n[{"tool_name": "get_weather", "parameters": {"city": "Par')
    head = {"index": 0, "id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    assert deltas == [
        {"tool_calls": [head]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Par'}}]},
    ]
    assert parser.feed("is") == [{"tool_calls": [{"index": 0, "function": {"arguments": "is"}}]}]


@pytest.mark.parametrize("fmt", ["command_r", "command_r7b"])
def test_a_call_cut_short_keeps_its_arguments_cut_and_is_not_finished(specs, fmt: str) -> None:
    start = "<|START_ACTION|>[{" if fmt == "command_r7b" else "Action: ```json\n[{"
    cut = parse_tool_calls(start + '"tool_name": "add", "parameters": {"a": 1, "b"', specs, fmt)
    assert [(c.name, c.arguments) for c in cut.tool_calls] == [("add", '{"a": 1, "b"')]
    assert cut.finish_reason("length") == "length" and cut.finish_reason("stop") == "stop"
    named = parse_tool_calls(start + '"tool_name": "now", "param', specs, fmt)
    assert [(c.name, c.arguments) for c in named.tool_calls] == [("now", "")]  # cut after its name
    scaffold = parse_tool_calls(start + '"tool_na', specs, fmt, calls_only=True)
    assert scaffold.content is None and not scaffold.tool_calls  # a grammar of calls alone: no content


@pytest.mark.parametrize(("fmt", "text"), [("command_r", f"Action: ```json\n{R_CALLS}\n```"),
                                           ("command_r7b", f"<|START_ACTION|>{R7B_CALLS}<|END_ACTION|>")])  # fmt: skip
def test_max_calls_keeps_the_first_call_streamed_or_whole(specs, fmt: str, text: str) -> None:
    whole = parse_tool_calls(text, specs, fmt, max_calls=1)
    assert len(whole.tool_calls) == 1 and whole.dropped_calls
    parser = ToolCallParser(specs, fmt, max_calls=1)
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()
    assert [c["function"]["name"] for c in assemble(deltas)[1]] == [whole.tool_calls[0].name]


ALPHABET = st.sampled_from(
    [
        *'{}[]",: \n\\ab`',
        "Action:",
        "```json",
        "<|START_ACTION|>",
        "<|END_ACTION|>",
        "<|START_RESPONSE|>",
        "<|END_THINKING|>",
        "<|",
        '"tool_name"',
        '"parameters"',
        '"tool_call_id"',
        '"0"',
        '"now"',
        '"add"',
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(ALPHABET, max_size=40), st.sampled_from(["command_r", "command_r7b"]), st.randoms(use_true_random=False)
)
def test_any_text_parses_the_same_streamed_or_whole(specs, pieces, fmt, rng) -> None:
    text = "".join(pieces)
    whole = parse_tool_calls(text, specs, fmt, new_id=counter_ids())
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 5))) if len(text) > 1 else []
    deltas, result = streamed(text, specs, fmt, cuts)
    assert result == whole and assemble(deltas) == as_openai(whole)
    assert whole.raw == text


class _Vocab:
    """A tokenizer that has R7B's action markers as tokens of their own."""

    def token_to_id(self, text: str) -> int | None:
        return {"<|START_ACTION|>": 7, "<|END_ACTION|>": 8, "<tool_call>": 9}.get(text)


def test_r7b_keeps_its_action_markers_in_the_decoded_text() -> None:
    assert call_token_ids(_Vocab(), "command_r7b") == {7, 8}
    assert call_token_ids(_Vocab(), "command_r") == frozenset()  # `Action:` is text
