"""A reply cut by the length limit after a call's name but before its arguments open (`{"tool_calls": [{"name":
"now", "argu`): the parser waited for `"arguments": {`, gave up at the end, and returned the raw scaffold as the
reply's content with no call. docs/tool_calls.md has a call out once its name is read: it is the call, its
arguments empty (as when the limit cuts inside them), finish_reason "length", streamed and whole alike."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.tools import assemble, normalize_tools, parse_tool_calls
from tests.runtime.structured.conftest import PAGE, TOOLS

NAMED = {"type": "function", "function": {"name": "now"}}
ASK = [{"role": "user", "content": "What time is it?"}]
SCAFFOLD = '{"tool_calls": [{"name": "now", "arguments": {'


@pytest.mark.parametrize("limit", [30, 37, 45])
def test_a_reply_cut_after_the_name_is_that_call(engine: Engine, limit: int) -> None:
    whole = engine.chat(ASK, limit, tools=TOOLS, tool_choice=NAMED)
    raw = engine.tokenizer.decode(list(whole.token_ids))
    # the independent expectation: the model wrote the name whole, and no more than the scaffold up to the arguments
    assert SCAFFOLD.startswith(raw) and len(raw) > SCAFFOLD.index('"now"') + 4, raw
    assert whole.finish_reason == "length" and whole.text == ""
    assert [(c.name, c.arguments) for c in whole.tool_calls] == [("now", "")]

    async def deltas() -> list[dict[str, Any]]:
        return [d async for d in engine.stream(ASK, limit, tools=TOOLS, tool_choice=NAMED)]

    content, calls = assemble(asyncio.run(deltas()))
    assert content is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("now", "")]


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("generic", '{"tool_calls": [{"name": "now", "argu'),
        ("generic", '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now"'),
        ("hermes", 'Let me see.<tool_call>\n{"name": "now", "arguments": '),
    ],
)
def test_the_parser_gives_a_call_once_its_name_is_read(fmt: str, text: str) -> None:
    specs = normalize_tools(TOOLS)
    result = parse_tool_calls(text, specs, fmt)
    assert result.tool_calls[-1].name == "now" and result.tool_calls[-1].arguments == ""
    assert not result.complete and result.finish_reason("length") == "length"
    assert result.content == ("Let me see." if fmt == "hermes" else None)
    for cut in ('{"tool_calls": [{"name": "no', '{"tool_calls": [{"name": "nowhere", "argu'):  # no name read
        assert parse_tool_calls(cut, specs).tool_calls == ()


@pytest.mark.parametrize("limit", [30, 37, 45])
def test_a_call_cut_after_the_name_replayed_extends_the_cached_prompt(engine: Engine, limit: int) -> None:
    """The client sends the call back as received (arguments ""): the next prompt is the last prompt and the
    tokens the model wrote, and the cache serves them."""
    from radixcache.runtime.tools.use import ToolUse

    first = engine.chat(ASK, limit, tools=TOOLS, tool_choice=NAMED)
    (call,) = first.tool_calls
    reply = {"role": "assistant", "content": None, "tool_calls": [call.to_openai()]}
    history = [*ASK, reply, {"role": "tool", "tool_call_id": call.id, "content": "12:00"}]
    use = ToolUse.of(TOOLS, "auto")
    before = engine.tokenizer.encode(engine._builder.render(ASK, use)) + list(first.token_ids)
    prompt = engine._builder.render(history, use)
    assert engine.tokenizer.encode(prompt)[: len(before)] == before
    assert engine.tokenizer.decode(list(first.token_ids)) + "<|im_end|>" in prompt  # as written, not `{}` closed
    second = engine.chat(history, 1, tools=TOOLS)
    assert second.cached_tokens >= (len(before) - 1) // PAGE * PAGE  # the reply's last token has no KV yet
