"""Tools over HTTP with Cohere's Command R7B template (tests/command_r_templates.py) on the tiny checkpoint, through
the `openai` package: required and named choices give calls that validate, written as `<|START_ACTION|>[...]
<|END_ACTION|>`; the stream carries OpenAI's tool-call deltas and assembles to the whole reply's calls; a reply in
the format that the model wrote under "auto" (a regex stands in for such a model) is parsed into its calls, its plan
the content; an agent loop's history (calls and results sent back by id) is served."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tests.command_r_templates import COMMAND_R7B
from tests.tiny_tools import TOOLS, check_calls

pytestmark = pytest.mark.xdist_group("tools_command_r")  # its module-scoped server, started once
ASK = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def server(templated_model, launch):
    with launch(templated_model("command_r7b", COMMAND_R7B), "--capacity-blocks", "512", "--threads", "1") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    import openai

    with openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def _ask(client, messages: list[dict[str, Any]] = ASK, **kw: Any) -> Any:
    kw = {"model": "tiny", "messages": messages, "tools": TOOLS, "max_tokens": 200, "parallel_tool_calls": False, **kw}
    return client.chat.completions.create(**kw)


def test_required_and_named_calls_validate_and_the_history_goes_on(client) -> None:
    messages = [*ASK]
    for step, choice in enumerate(("required", {"type": "function", "function": {"name": "add"}})):
        reply = _ask(client, messages, tool_choice=choice, temperature=1.0, seed=step).choices[0]
        assert reply.finish_reason == "tool_calls" and reply.message.content is None, reply
        names = [name for name, _ in check_calls(reply.message.tool_calls)]
        assert len(names) == 1 and (choice == "required" or names == ["add"])
        calls = [c.model_dump() for c in reply.message.tool_calls]
        messages += [{"role": "assistant", "content": None, "tool_calls": calls}]
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": f"ok {step}"} for c in calls]
    assert _ask(client, messages, max_tokens=2).usage.prompt_tokens > 0


def test_the_stream_assembles_to_the_whole_replys_calls(client, server) -> None:
    whole = _ask(client, tool_choice="required", temperature=0).choices[0].message
    body = {"model": "tiny", "messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 0}
    body |= {"max_tokens": 200, "parallel_tool_calls": False, "stream": True}
    with httpx.stream("POST", server.v1 + "/chat/completions", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events]
    calls = [tc for d in deltas for tc in d.get("tool_calls", ())]
    assert set(calls[0]) == {"index", "id", "type", "function"} and calls[0]["function"]["arguments"] == ""
    assert all(set(tc) == {"index", "function"} for tc in calls[1:])
    arguments = "".join(tc["function"]["arguments"] for tc in calls)
    assert [(calls[0]["function"]["name"], arguments)] == [
        (c.function.name, c.function.arguments) for c in whole.tool_calls
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert "".join(d.get("content") or "" for d in deltas) == ""


def test_a_reply_written_in_the_format_under_auto_is_its_plan_and_calls(client, tiny_model_dir) -> None:
    from radixcache.runtime.loading import load_config_and_tokenizer

    plan = 'I add.<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "add", "parameters": {"a": 2, "b": 3}}]'
    written = plan + "<|END_ACTION|>"
    # the regex's path, not the calls' (which begin with `<`): its first token leaned on
    (first,) = load_config_and_tokenizer(str(tiny_model_dir))[1].encode("I", add_special_tokens=False)
    extra, bias = {"regex": re.escape(written)}, {str(first): 100}
    reply = _ask(client, tool_choice="auto", extra_body=extra, logit_bias=bias).choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.content == "I add.", reply
    assert check_calls(reply.message.tool_calls) == [("add", {"a": 2, "b": 3})]
