"""The Responses API's parts without a model: the response store (least recently used dropped first, bounded by
count and bytes, one tenant never reading another's) over HTTP with two API keys, and the translation of items into
the chat path's messages (calls joining the assistant message before them, errors named by the Responses paths)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from radixcache.runtime.server.protocol import APIError
from radixcache.runtime.server.responses_input import PREVIOUS, item_of, messages_of, renamed
from radixcache.runtime.server.responses_store import ResponseStore


def _response(rid: str, text: str = "x") -> dict[str, Any]:
    return {"id": rid, "object": "response", "output": [{"type": "message", "text": text}]}


def test_the_store_drops_the_least_recently_used_past_its_count() -> None:
    store = ResponseStore(max_entries=2)
    for rid in ("a", "b"):
        assert store.put(None, _response(rid), [], [])
    assert store.get(None, "a") is not None  # now the most recent: b goes first
    store.put(None, _response("c"), [], [])
    assert [store.get(None, r) is not None for r in "abc"] == [True, False, True] and len(store) == 2


def test_the_store_is_bounded_in_bytes_and_refuses_an_entry_larger_than_the_bound() -> None:
    store = ResponseStore(max_bytes=400)
    assert not store.put(None, _response("huge", "x" * 1000), [], [])
    assert store.get(None, "huge") is None and store.bytes == 0
    for i in range(10):
        assert store.put(None, _response(f"r{i}", "y" * 100), [], [])
        assert store.bytes <= 400
    assert store.get(None, "r9") is not None and store.get(None, "r0") is None
    assert store.delete(None, "r9") and not store.delete(None, "r9")
    assert store.bytes == sum(e.size for e in store._entries.values())


def test_a_tenant_never_reads_nor_deletes_another_tenants_response() -> None:
    store = ResponseStore()
    store.put("alice", _response("r"), [], [])
    assert store.get("bob", "r") is None and store.get(None, "r") is None
    assert not store.delete("bob", "r") and store.get("alice", "r") is not None


@pytest.fixture(scope="module")
def keyed(tiny_model_dir, launch):
    with launch(tiny_model_dir, "--api-key", "sk-alice", "--api-key", "sk-bob", "--capacity-blocks", "256") as s:
        yield s


def test_over_http_one_key_cannot_read_continue_nor_delete_anothers_response(keyed) -> None:
    alice = openai.OpenAI(base_url=keyed.v1, api_key="sk-alice", max_retries=0, timeout=60)
    bob = openai.OpenAI(base_url=keyed.v1, api_key="sk-bob", max_retries=0, timeout=60)
    r = alice.responses.create(model="tiny", input="secret", max_output_tokens=2, temperature=0)
    assert alice.responses.retrieve(r.id).id == r.id
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(r.id)
    with pytest.raises(openai.BadRequestError) as exc:
        bob.responses.create(model="tiny", input="more", previous_response_id=r.id)
    assert exc.value.code == "previous_response_not_found"
    follow = alice.responses.create(model="tiny", input="more", previous_response_id=r.id, max_output_tokens=2)
    assert follow.previous_response_id == r.id
    assert httpx.get(keyed.v1 + f"/responses/{r.id}", timeout=10).status_code == 401  # no key: refused first


def test_calls_join_the_assistant_message_before_them_and_outputs_answer_them() -> None:
    items = [
        item_of({"role": "user", "content": "q"}, "input.0"),
        item_of(
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed", "content": []}, "input.1"
        ),
        item_of({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1"}, "input.2"),
        item_of({"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"}, "input.3"),
        item_of(
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "1"}]}, "i"
        ),
        item_of({"type": "function_call_output", "call_id": "c2", "output": "2"}, "input.5"),
    ]
    messages, sources = messages_of(items, [PREVIOUS, "input.1", "input.2", "input.3", "input.4", "input.5"], "sys")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assistant = messages[2]
    assert assistant["content"] is None and [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "1"}
    assert sources == [["instructions"], [PREVIOUS], ["input.1", "input.2", "input.3"], ["input.4"], ["input.5"]]


@pytest.mark.parametrize(
    ("param", "expected"),
    [
        ("messages.2.content", "input.1.content"),
        ("messages.2.tool_calls.1.function.arguments", "input.3.arguments"),
        ("messages.2.tool_calls.0.id", "input.2.call_id"),
        ("tools.0.function.parameters.properties.x", "tools.0.parameters.properties.x"),
        ("tool_choice.function.name", "tool_choice.name"),
        ("response_format.json_schema.schema.type", "text.format.schema.type"),
        ("max_completion_tokens", "max_output_tokens"),
        ("max_tokens", "max_output_tokens"),
        ("temperature", "temperature"),
    ],
)
def test_chat_paths_are_renamed_to_the_responses_fields(param: str, expected: str) -> None:
    sources = [["instructions"], ["input.0"], ["input.1", "input.2", "input.3"]]
    assert renamed(APIError(400, f"{param}: bad", param=param), sources).param == expected
