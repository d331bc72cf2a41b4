"""The engine (RequestBuilder.render), the server (server.structured.render_chat) and the cluster's front door
(cluster.calls.render_messages) each rendered a chat with its tools and memory of the calls by a copy of the same
logic, which could drift: one path's prompt then missed the cache the others hit. They share runtime.tools.prompt;
here all three give the same text for a set of histories (tool rounds, replayed calls the memory knows, cut calls,
another namespace's calls, no tools), and refuse tools the same way on a tokenizer that cannot render them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from radixcache.runtime.cluster.calls import render_messages
from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.engine.request_builder import RequestBuilder
from radixcache.runtime.loading import load_config_and_tokenizer
from radixcache.runtime.server.protocol import APIError
from radixcache.runtime.server.structured import render_chat
from radixcache.runtime.testing import CharTokenizer
from radixcache.runtime.tools import ToolCallMemory, parse_tool_calls
from tests.runtime.tools.conftest import TOOLS

ASK = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris, and the time?"}]
OUTPUTS = [
    '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}',  # not the re-rendered form
    '{"tool_calls": [{"name": "now", "argu',  # cut after the name: arguments ""
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa',  # cut inside the arguments
]


def histories(memory: ToolCallMemory, specs: Any) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = [ASK]
    for n, raw in enumerate(OUTPUTS):
        parsed = parse_tool_calls(raw, specs)
        (memory.scoped("tenant") if n == 0 else memory).remember(parsed.tool_calls, parsed.raw, content="")
        reply = {"role": "assistant", "content": None, "tool_calls": [c.to_openai() for c in parsed.tool_calls]}
        answers = [{"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in parsed.tool_calls]
        out.append([*ASK, reply, *answers])
    return out


@pytest.mark.parametrize("namespace", [None, "tenant", "other"])
@pytest.mark.parametrize("tools", [TOOLS, None])
def test_the_engine_the_server_and_the_front_door_render_a_chat_alike(tiny_dir, specs, namespace, tools) -> None:
    config, tok = load_config_and_tokenizer(str(tiny_dir))
    memory = ToolCallMemory()
    builder = RequestBuilder(tok, config, 16, 0, torch.device("cpu"), tool_memory=memory)
    opts = RequestOptions.of(tools=tools, namespace=namespace)
    engine = SimpleNamespace(tokenizer=tok, tool_memory=memory)
    for history in histories(memory, specs):
        prompt = builder.render(history, opts.tool_use, namespace)
        assert prompt == render_chat(engine, history, opts.tool_use, namespace)
        assert prompt == render_messages(tok, memory, history, opts)
        assert prompt.startswith(builder.render(ASK, opts.tool_use, namespace))
    cut = histories(memory, specs)[2]
    assert OUTPUTS[1] + "<|im_end|>" in builder.render(cut, opts.tool_use, namespace)  # the memory's text


def test_a_tokenizer_without_tools_renders_the_messages_alike_and_refuses_tools() -> None:
    tok = CharTokenizer()
    config = SimpleNamespace(vocab_size=tok.vocab_size)
    builder = RequestBuilder(tok, config, 16, 0, torch.device("cpu"))  # type: ignore[arg-type]
    engine = SimpleNamespace(tokenizer=tok, tool_memory=ToolCallMemory())
    plain = [{"role": "user", "content": "hi"}]
    none = RequestOptions.of()
    assert (
        builder.render(plain) == render_chat(engine, plain, None) == render_messages(tok, ToolCallMemory(), plain, none)
    )
    use = RequestOptions.of(tools=TOOLS).tool_use
    with pytest.raises(ValueError, match="tools: this model's tokenizer cannot render tools"):
        builder.render(plain, use)
    with pytest.raises(ValueError, match="tools: this model's tokenizer cannot render tools"):
        render_messages(tok, ToolCallMemory(), plain, RequestOptions.of(tools=TOOLS))
    with pytest.raises(APIError) as err:
        render_chat(engine, plain, use)
    assert (err.value.status, err.value.param) == (400, "tools")
