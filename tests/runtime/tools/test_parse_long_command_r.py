"""Long outputs in Cohere's formats through the tool-call parser, streamed in random pieces and whole: the results
agree, the call is the one the text holds, and the work is linear in the output's length (counted, not timed, as in
test_parse_long.py: the text the Command-R machine holds after each delta, summed over the deltas, and the whitespace
it tests while it waits through a model's flood of newlines)."""

from __future__ import annotations

import json
import random

import pytest

from radixcache.runtime.tools import ToolCallParser, assemble, parse_tool_calls
from tests.runtime.tools.test_parse_long import CITY, SPECS, CountingWhitespace, counter_ids, long_text


def shapes(rng: random.Random, n: int, seed: int) -> dict[str, tuple[str, str]]:
    value = long_text(rng, n).replace("<|", "(|").replace("Action:", "Act:")
    CITY[seed] = {"city": value, "unit": "c"}
    args = json.dumps(CITY[seed], ensure_ascii=False)
    return {
        "r-streamed": (
            "command_r",
            f'Plan.\nAction: ```json\n[{{"tool_name": "get_weather", "parameters": {args}}}]\n```',
        ),
        "r-held": ("command_r", f'Action: ```json\n[{{"parameters": {args}, "tool_name": "get_weather"}}]\n```'),
        "r7b-streamed": (
            "command_r7b",
            f'{value}<|START_ACTION|>[{{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {args}}}]'
            "<|END_ACTION|>",
        ),
        "r7b-held": (
            "command_r7b",
            f'<|START_ACTION|>[{{"parameters": {args}, "tool_name": "get_weather"}}]<|END_ACTION|>',
        ),
        "r7b-unclosed": ("command_r7b", f'<|START_ACTION|>[{{"parameters": {args}'),
        "content": ("command_r7b", value),
    }


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("shape", list(shapes(random.Random(0), 10, -1)))
def test_long_outputs_parse_the_same_streamed_or_whole_in_linear_work(shape: str, seed: int) -> None:
    rng = random.Random(seed)
    fmt, text = shapes(rng, 60_000, seed)[shape]
    whole = parse_tool_calls(text, SPECS, fmt, new_id=counter_ids())
    parser = ToolCallParser(SPECS, fmt, new_id=counter_ids())
    deltas, held, feeds, i = [], 0, 0, 0
    while i < len(text):
        step = rng.randint(1, 40)
        deltas += parser.feed(text[i : i + step])
        held, feeds, i = held + len(parser.command_r.text), feeds + 1, i + step
    deltas += parser.finish()
    assert parser.result() == whole and whole.raw == text
    assert assemble(deltas) == (whole.content, [c.to_openai() for c in whole.tool_calls])
    if shape.endswith(("streamed", "held")):
        assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [("get_weather", CITY[seed])]
    assert held <= 4 * len(text) + 200 * feeds, (held, len(text), feeds)


FLOODS = {
    "after-action": ("command_r", "Action:" + "\n" * 8000 + '[{"tool_name": "now", "parameters": {}}]'),
    "in-list": ("command_r7b", "<|START_ACTION|>[" + "\n " * 4000 + '{"tool_name": "now", "parameters": {}}]'),
    "after-call": ("command_r", 'Action: [{"tool_name": "now", "parameters": {}}' + "\n" * 8000 + "]"),
}


@pytest.mark.parametrize("shape", list(FLOODS))
def test_whitespace_the_parser_waits_through_is_read_once(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from radixcache.runtime.tools import scan

    monkeypatch.setattr(scan, "WHITESPACE", CountingWhitespace(scan.WHITESPACE))
    fmt, text = FLOODS[shape]
    whole = parse_tool_calls(text, SPECS, fmt, new_id=counter_ids())
    assert [c.name for c in whole.tool_calls] == ["now"]
    parser = ToolCallParser(SPECS, fmt, new_id=counter_ids())
    CountingWhitespace.tests = 0
    deltas = [d for ch in text for d in parser.feed(ch)] + parser.finish()
    assert parser.result() == whole and assemble(deltas) == (whole.content, [c.to_openai() for c in whole.tool_calls])
    assert CountingWhitespace.tests <= 20 * len(text), CountingWhitespace.tests
