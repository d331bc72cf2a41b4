"""Tool calls under API keys: the text the model wrote for its calls (the engine's `ToolCallMemory`, which renders
a replayed call as those very tokens) is the caller's namespace's only. Shared, a history naming another tenant's
call rendered with that tenant's remembered text, whose length (`usage.prompt_tokens`) told what the model wrote."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcache.runtime import Engine
from radixcache.runtime.server.generation import namespace_for
from radixcache.runtime.tools import ToolCall
from tests.server.keyed_tiny import keyed_client, tiny_engine
from tests.tiny_tools import TOOLS

ASK = {"role": "user", "content": "Add one and two."}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with tiny_engine(tmp_path_factory, "tool_memory_tenants") as engine:
        yield engine


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[TestClient]:
    with keyed_client(engine) as client:
        yield client


def _chat(client: TestClient, key: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": messages, "tools": TOOLS, "max_tokens": 1, **extra}
    r = client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    return r.json()


def _history(call: ToolCall) -> list[dict[str, Any]]:
    replay = {"role": "assistant", "content": None, "tool_calls": [call.to_openai()]}
    return [ASK, replay, {"role": "tool", "tool_call_id": call.id, "content": "3"}]


def test_a_call_is_remembered_in_its_callers_namespace(client: TestClient, engine: Engine) -> None:
    # one call, greedy: sampled, the tiny model's parallel calls were cut at the token limit now and then (a cut
    # reply's calls are not remembered)
    r = _chat(
        client, "sk-alice", [ASK], tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=400
    )
    assert r["choices"][0]["finish_reason"] == "tool_calls"
    calls = [
        ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in r["choices"][0]["message"]["tool_calls"]
    ]
    alice, bob = (engine.tool_memory.scoped(namespace_for(k)) for k in ("sk-alice", "sk-bob"))
    assert alice.lookup(calls) is not None
    assert bob.lookup(calls) is None and engine.tool_memory.scoped(None).lookup(calls) is None


def test_another_keys_remembered_text_never_renders_in_a_history(client: TestClient, engine: Engine) -> None:
    call = ToolCall("call_0123456789abcdef00000000", "add", '{"a": 1, "b": 2}')
    written = '{"name": "add", "arguments": {"a": 1, "b": 2}}' + " padding" * 40  # far longer than a render
    engine.tool_memory.scoped(namespace_for("sk-alice")).remember([call], written, content="")
    usage = {k: _chat(client, k, _history(call))["usage"]["prompt_tokens"] for k in ("sk-alice", "sk-bob")}
    fresh = ToolCall("call_fedcba987654321000000000", call.name, call.arguments)  # the same call, never remembered
    unknown = _chat(client, "sk-bob", _history(fresh))["usage"]["prompt_tokens"]
    assert usage["sk-alice"] > unknown + 40  # alice's own history renders with the text remembered for her
    assert usage["sk-bob"] == unknown  # bob's renders as a call nobody remembered
