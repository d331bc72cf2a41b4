"""Tools over HTTP with a model whose chat template renders tools itself and writes calls as `<tool_call>` tags
(Hermes, as Qwen2.5 and Hermes models do): the tiny checkpoint with that template, through the `openai` package.
Required and named choices give calls that validate, the stream's deltas assemble to the whole reply's calls, and an
agent loop caches each previous prompt and output in whole pages."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tests.runtime.tools.test_prefix import HERMES
from tests.tiny_tools import TOOLS, check_calls

pytestmark = pytest.mark.xdist_group("tools_hermes")  # its module-scoped server, started once
PAGE = 16
ASK = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def hermes(templated_model, launch):
    with launch(templated_model("hermes", HERMES), "--capacity-blocks", "512", "--threads", "1") as server:
        yield server


@pytest.fixture(scope="module")
def client(hermes):
    import openai

    with openai.OpenAI(base_url=hermes.v1, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def _ask(client, messages: list[dict[str, Any]] = ASK, **kw: Any) -> Any:
    kw = {"model": "tiny", "messages": messages, "tools": TOOLS, "max_tokens": 200, "parallel_tool_calls": False, **kw}
    return client.chat.completions.create(**kw)


def test_required_and_named_calls_validate(client) -> None:
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        for seed in range(3):
            choice_ = _ask(client, tool_choice=choice, temperature=1.0, seed=seed).choices[0]
            assert choice_.finish_reason == "tool_calls" and choice_.message.content is None, choice_
            names = [name for name, _ in check_calls(choice_.message.tool_calls)]
            assert len(names) == 1 and (choice == "required" or names == ["add"])


def test_a_named_choice_makes_exactly_one_call_even_with_parallel_calls(client) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    r = _ask(client, tool_choice=named, parallel_tool_calls=True, temperature=1.0, seed=5, n=8, max_tokens=240)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls", choice
        assert [name for name, _ in check_calls(choice.message.tool_calls)] == ["add"], choice.message.tool_calls


def test_the_stream_assembles_to_the_whole_replys_calls(client, hermes) -> None:
    whole = _ask(client, tool_choice="required", temperature=0).choices[0].message
    body = {"model": "tiny", "messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 0}
    body |= {"max_tokens": 200, "parallel_tool_calls": False, "stream": True}
    with httpx.stream("POST", hermes.v1 + "/chat/completions", json=body, timeout=60) as r:
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


def test_an_agent_loop_caches_each_previous_prompt_and_output(client) -> None:
    messages = [{"role": "system", "content": "Use the tools (loop)."}, *ASK[1:]]
    previous = None
    for step in range(3):
        r = _ask(client, messages, tool_choice="required", temperature=0.9, seed=step)
        message = r.choices[0].message
        check_calls(message.tool_calls)
        if previous is not None:
            assert r.usage.prompt_tokens_details.cached_tokens >= (previous - 1) // PAGE * PAGE, (step, r.usage)
        previous = r.usage.prompt_tokens + r.usage.completion_tokens
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in message.tool_calls]}
        )
        messages += [{"role": "tool", "tool_call_id": c.id, "content": f"ok {step}"} for c in message.tool_calls]


def test_text_on_both_sides_of_a_call_replayed_in_a_streams_order_hits_the_cache(client) -> None:
    """A Responses stream lists a reply's items as the model wrote them: text, the call, more text (each text an
    item of its own), where the whole answer holds one message of both texts, then the call. Replayed in the
    stream's order, the text after the call was a second assistant message: another prompt than the one the model
    wrote, which the cache missed from that turn on (a reply forced here by a regex on the chat endpoint, greedy:
    under "auto" the regex joins the calls' grammar, which a sampled reply might take instead)."""
    system, ask = "Use the tools (text both sides).", "What time is it?"
    written = 'Checking.<tool_call>{"name": "now", "arguments": {}}</tool_call> Done.'
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": ask}],
        tools=TOOLS,
        max_tokens=200,
        temperature=0,
        extra_body={"regex": re.escape(written)},
    )
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].message.content == "Checking.Done." and call.function.name == "now"
    previous = r.usage.prompt_tokens + r.usage.completion_tokens

    def said(text: str) -> dict[str, Any]:
        return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}

    item = {"type": "function_call", "call_id": call.id, "name": "now", "arguments": call.function.arguments}
    answer = {"type": "function_call_output", "call_id": call.id, "output": "12:00"}
    streamed = [{"role": "user", "content": ask}, said("Checking."), item, said("Done."), answer]
    follow = client.responses.create(
        model="tiny",
        instructions=system,
        input=streamed,
        tools=[{"type": "function", **t["function"]} for t in TOOLS],
        max_output_tokens=1,
    )
    assert follow.usage.input_tokens_details.cached_tokens >= (previous - 1) // PAGE * PAGE, follow.usage
