"""A conversation whose replica dies between its turns, through the front door over HTTP without Ray: the real
replica class in-process (tests/cluster/inproc_ray.py, where a stream started on a dead actor fails with the actor
error as Ray's does) on the tiny checkpoint. The next turn, routed by its session to the dead replica, is re-sent to
the live one; a tool turn still renders the calls from the front door's memory (it is the front door's, not the dead
replica's), so its prompt is the one the dead replica would have read; and the turn after hits the new replica's
cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from radixcache.runtime.server.structured import render_chat
from radixcache.runtime.tools import ToolUse

PAGE = 4
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch, tiny_dir: Path) -> Iterator[tuple[TestClient, Any, Any]]:
    from tests.cluster.inproc_ray import install

    ray = install(monkeypatch)
    from radixcache.runtime.cluster.cluster import ReplicaCluster
    from radixcache.runtime.cluster.front import ClusterEngine
    from radixcache.runtime.server import create_app

    threads = torch.get_num_threads()
    cluster = ReplicaCluster(str(tiny_dir), 2, engine_kwargs={"page_size": PAGE}, poll_interval=None)
    engine = ClusterEngine(cluster, str(tiny_dir))
    try:
        with TestClient(create_app(engine, "tiny")) as client:
            yield client, engine, ray
    finally:
        engine.close()
        for actor in ray.actors:
            actor.obj.engine.close()
        torch.set_num_threads(threads)  # a replica sets its own count


def _turn(client: TestClient, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "tiny", "messages": messages, "tools": [NOW], "tool_choice": "required", "user": "agent-1"}
    r = client.post("/v1/chat/completions", json={**body, "max_tokens": 80, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_tool_turn_whose_replica_died_is_served_by_another(served: tuple[TestClient, Any, Any]) -> None:
    client, front, ray = served
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What time is it?"}]
    first = _turn(client, messages)
    calls = first["choices"][0]["message"]["tool_calls"]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "12:00"},
    ]
    (holder,) = [r for r in front.cluster.alive if front.cluster.index.pages(r)]
    emitted = front.tool_memory.lookup_emitted([_call(c) for c in calls])
    ray.kill(front.cluster.actor(holder))
    prompt = front.tokenizer.encode(render_chat(front, messages, ToolUse.of([NOW], "required")))
    assert emitted is not None and emitted[0] in front.tokenizer.decode(prompt, skip_special_tokens=False)

    second = _turn(client, messages)
    stats = front.cluster.stats()
    assert stats.alive == (1 - holder,) and stats.retries == 1 and stats.deaths == 1
    assert second["usage"]["prompt_tokens"] == len(prompt)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the live replica never saw it
    calls = second["choices"][0]["message"]["tool_calls"]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "12:01"},
    ]
    third = _turn(client, messages)  # on the live replica, which computed the last prompt and reply
    done = second["usage"]["prompt_tokens"] + second["usage"]["completion_tokens"]
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] >= (done - 1) // PAGE * PAGE
    assert front.cluster.loads.in_flight() == 0 and front.check()["locked_blocks"] == 0


def _call(c: dict[str, Any]) -> Any:
    from radixcache.runtime.tools.messages import ToolCall

    return ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
