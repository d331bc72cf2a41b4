"""The front door remembers what a replica's model wrote for its calls in the request's cache namespace, as an
Engine does (runtime.tools.memory): it remembered them unscoped, so under `serve --replicas` another tenant's history
naming those calls rendered with that text, and one tenant's traffic evicted every other's calls."""

from __future__ import annotations

from dataclasses import dataclass

from radixcache.runtime.cluster.calls import own_calls
from radixcache.runtime.cluster.handles import RemoteRequest
from radixcache.runtime.tools import ToolCallMemory
from radixcache.runtime.tools.messages import ToolCall
from radixcache.runtime.tools.use import CallIds


@dataclass(frozen=True)
class Result:
    tool_calls: tuple[ToolCall, ...]
    text: str = ""


def test_a_replicas_calls_are_remembered_in_the_requests_namespace() -> None:
    memory = ToolCallMemory()
    written = ToolCall("replica_id", "add", '{"a": 1}')
    result = Result((written,))
    req = RemoteRequest(rid="r1", call_ids=CallIds("0" * 16))
    emitted = ('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', (5, 6, 7))
    mine = own_calls(memory, result, emitted, req, "tenant-a")
    calls = list(mine.tool_calls)
    assert calls[0].id != "replica_id"  # the front door's own id
    assert memory.scoped("tenant-a").lookup_emitted(calls) == emitted
    assert memory.scoped("tenant-b").lookup_emitted(calls) is None
