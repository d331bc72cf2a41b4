"""Long outputs through the tool-call parser, streamed in random pieces and whole: the results agree, and the work
is linear in the output's length. The parser appended each delta to the whole output (a copy of it per delta), put
each argument piece on the call's whole arguments, and looked for a Hermes tag's close from the tag's start at
every delta: a 400 KB call took 5.7 s streamed, 12.9 s in a Hermes tag of a non-streaming shape. The work is
counted, not timed: the text the parser holds after each delta (which each delta's copy and scans go over)
summed over the deltas stays within a few times the output's length, where it grew with its square."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from radixcache.runtime.tools import ToolCallParser, assemble, normalize_tools, parse_tool_calls
from tests.tiny_tools import TOOLS

SPECS = normalize_tools(TOOLS)


def counter_ids():
    n = itertools.count()
    return lambda: f"call_{next(n)}"


def long_text(rng: random.Random, n: int) -> str:
    """Random text of about `n` characters with what a scanner must respect: quotes, escapes, braces, tags."""
    pieces = ["a", "b c", "\\", '\\"', "{", "}", "[", "]", "é", "\n", "<tool_call>", "</tool", "😀"]
    return "".join(rng.choice(pieces) for _ in range(n // 2))


CITY: dict[int, dict[str, str]] = {}


def shapes(rng: random.Random, n: int, seed: int = -1) -> dict[str, tuple[str, str]]:
    value = long_text(rng, n)
    CITY[seed] = {"city": value, "unit": "c"}
    args = json.dumps(CITY[seed], ensure_ascii=False)
    prose = value.replace("<", "(")  # content before a Hermes call: no tag in it
    return {
        "generic-streamed": ("generic", f'{{"tool_calls": [{{"name": "get_weather", "arguments": {args}}}]}}'),
        "generic-held": ("generic", f'{{"tool_calls": [{{"arguments": {args}, "name": "get_weather"}}]}}'),
        "generic-content": ("generic", value),
        "generic-long-name": ("generic", '{"tool_calls": [{"name": "' + "x" * n + '", "arguments": {}}]}'),
        "hermes-held": ("hermes", f'<tool_call>\n{{"arguments": {args}, "name": "get_weather"}}\n</tool_call>'),
        "hermes-streamed": (
            "hermes",
            f'{prose}<tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>',
        ),
        "hermes-unclosed": ("hermes", f'<tool_call>\n{{"arguments": {args}'),
    }


def streamed(text: str, fmt: str, rng: random.Random) -> tuple[list, object, int, int]:
    """The deltas, the result, the text held summed over the deltas, and the number of deltas."""
    parser = ToolCallParser(SPECS, fmt, new_id=counter_ids())
    deltas, held, feeds, i = [], 0, 0, 0
    while i < len(text):
        step = rng.randint(1, 40)
        deltas += parser.feed(text[i : i + step])
        held, feeds, i = held + len(parser.text), feeds + 1, i + step
    deltas += parser.finish()
    return deltas, parser.result(), held, feeds


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shape", list(shapes(random.Random(0), 10)))
def test_long_outputs_parse_the_same_streamed_or_whole_in_linear_work(shape: str, seed: int) -> None:
    rng = random.Random(seed)
    fmt, text = shapes(rng, 60_000, seed)[shape]
    whole = parse_tool_calls(text, SPECS, fmt, new_id=counter_ids())
    deltas, result, held, feeds = streamed(text, fmt, rng)
    assert result == whole and whole.raw == text
    assert assemble(deltas) == (whole.content, [c.to_openai() for c in whole.tool_calls])
    if shape.endswith(("streamed", "held")):  # the independent expectation: the call the text holds
        assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [("get_weather", CITY[seed])]
    assert held <= 4 * len(text) + 200 * feeds, (held, len(text), feeds)  # linear (it was about len(text)**2 / 40)


FLOODS = {  # a model looping on newlines (SmolLM2 left free does) where the parser waits for a call's next token
    "generic-before": ("generic", "\n" * 8000),
    "generic-open": ("generic", "{" + "\n " * 4000 + '"tool_calls": []}'),
    "generic-after-call": ("generic", '{"tool_calls": [{"name": "now", "arguments": {}}' + "\n" * 8000 + "]}"),
    "hermes-in-tag": ("hermes", "<tool_call>" + "\n" * 8000 + '{"name": "now", "arguments": {}}</tool_call>'),
    "hermes-after-call": ("hermes", '<tool_call>{"name": "now", "arguments": {}}</tool_call>' + "\n" * 8000),
}


class CountingWhitespace(str):
    """The parser's whitespace set, counting the characters tested against it: the parser's scanning work."""

    tests = 0

    def __contains__(self, ch: object) -> bool:
        CountingWhitespace.tests += 1
        return str.__contains__(self, ch)


@pytest.mark.parametrize("shape", list(FLOODS))
def test_whitespace_the_parser_waits_through_is_read_once(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whitespace where the parser waits for a call's next token was read again from its start at every delta:
    8,000 newlines, one a delta, took 5 to 17 s."""
    from radixcache.runtime.tools import scan

    monkeypatch.setattr(scan, "WHITESPACE", CountingWhitespace(scan.WHITESPACE))
    fmt, text = FLOODS[shape]
    whole = parse_tool_calls(text, SPECS, fmt, new_id=counter_ids())
    parser = ToolCallParser(SPECS, fmt, new_id=counter_ids())
    CountingWhitespace.tests = 0
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()
    assert parser.result() == whole and assemble(deltas) == (whole.content, [c.to_openai() for c in whole.tool_calls])
    assert CountingWhitespace.tests <= 20 * len(text), CountingWhitespace.tests  # it was about len(text)**2 / 2
