"""A reply sent back one message per call (runtime/tools/split_replies.py) renders as the reply the client would
have sent whole, and only when the memory knows that very reply; the prefix test is in test_prefix.py."""

from __future__ import annotations

import json

import pytest

from radixcache.runtime.tools import ToolCallMemory, parse_tool_calls
from tests.runtime.tools.test_prefix import FREEFORM, HERMES, HERMES_OUT, replayed

USER = {"role": "user", "content": "1+2 and the time?"}


def _reply(specs, raw: str, memory: ToolCallMemory, template: str | None) -> tuple[dict, list[dict]]:
    fmt = "hermes" if template else "generic"
    parsed = parse_tool_calls(raw, specs, fmt)
    memory.remember(parsed.tool_calls, parsed.raw)
    results = [{"role": "tool", "tool_call_id": c.id, "content": str(n)} for n, c in enumerate(parsed.tool_calls)]
    return json.loads(json.dumps(parsed.message())), results


@pytest.mark.parametrize("client", ["split", "interleaved"])
@pytest.mark.parametrize("template", [None, HERMES], ids=["generic", "hermes"])
def test_a_split_reply_renders_as_the_whole_reply(tiny_tokenizer, specs, client, template) -> None:
    tok, memory = tiny_tokenizer, ToolCallMemory()
    message, results = _reply(specs, (HERMES_OUT if template else FREEFORM)[1], memory, template)
    whole = tok.apply_chat_template([USER, message, *results], tools=specs, tool_memory=memory, chat_template=template)
    split = [USER, *replayed(message, results, client)]
    assert tok.apply_chat_template(split, tools=specs, tool_memory=memory, chat_template=template) == whole


@pytest.mark.parametrize("change", ["arguments", "content", "namespace", "order"])
def test_a_split_reply_the_memory_does_not_know_renders_as_sent(tiny_tokenizer, specs, change) -> None:
    """A piece whose call was edited, a later piece with content, another tenant's namespace, or the calls in another
    order: not the reply the model wrote, so each piece is its own turn, as without a memory."""
    memory = ToolCallMemory()
    message, results = _reply(specs, FREEFORM[1], memory.scoped("mine"), None)
    split = [USER, *replayed(message, results, "split")]
    if change == "arguments":
        split[2]["tool_calls"][0]["function"]["arguments"] = '{"x": 1}'
    elif change == "content":
        split[2]["content"] = "And the time."
    elif change == "order":
        split[1:3] = split[2:0:-1]
    handle = memory.scoped("other tenant" if change == "namespace" else "mine")
    tok = tiny_tokenizer
    rendered = tok.apply_chat_template(split, tools=specs, tool_memory=handle)
    assert rendered == tok.apply_chat_template(split, tools=specs, tool_memory=None)
    assert rendered.count("<|im_start|>assistant") == 3  # two pieces and the generation prompt


def test_the_first_id_index_is_bounded_with_the_entries(specs) -> None:
    memory = ToolCallMemory(max_entries=4)
    for _ in range(50):
        memory.remember(parse_tool_calls(FREEFORM[1], specs).tool_calls, FREEFORM[1])
    assert len(memory._store.by_first) == len(memory) == 4
