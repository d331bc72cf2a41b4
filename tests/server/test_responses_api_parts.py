"""The Responses API's parts: the response store (least recently used dropped first, bounded by count and bytes, one
tenant never reading another's, also over HTTP with two API keys), the translation of items into the chat path's
messages (calls joining the assistant message before them, errors named by the Responses paths), and the SSE events
of a stream from the chat path's events (items one after another, an empty reply, a failure mid-stream)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from radixcache.runtime.engine.errors import QueueFullError
from radixcache.runtime.engine.request import GenerationResult
from radixcache.runtime.server.generation import Event
from radixcache.runtime.server.protocol import APIError
from radixcache.runtime.server.responses_input import PREVIOUS, item_of, messages_of, renamed, replayed
from radixcache.runtime.server.responses_output import ResponseBuilder
from radixcache.runtime.server.responses_protocol import ResponsesRequest
from radixcache.runtime.server.responses_store import ResponseStore
from radixcache.runtime.server.responses_stream import ResponseStream
from radixcache.runtime.tools import ToolCall


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
    kept = [store.get(None, f"r{i}") for i in range(9)]
    assert store.bytes == store.tenant_bytes(None) == sum(e.size for e in kept if e is not None)


def test_one_tenants_traffic_never_pushes_out_anothers_and_all_tenants_share_a_byte_bound() -> None:
    store = ResponseStore(max_entries=3, max_total_bytes=10_000)
    store.put("alice", _response("a"), [], [])
    for i in range(20):  # bob's flood goes past his own bound: his oldest go, alice's stays
        store.put("bob", _response(f"b{i}"), [], [])
    assert store.get("alice", "a") is not None and len(store) == 4
    assert [store.get("bob", f"b{i}") is not None for i in (16, 17, 18, 19)] == [False, True, True, True]
    size = store.tenant_bytes("alice")
    assert store.bytes == size + store.tenant_bytes("bob")
    small = ResponseStore(max_total_bytes=3 * size)  # over all tenants: a tie goes to the one holding the longest
    for tenant in ("alice", "bob", "carol", "dave"):
        small.put(tenant, _response("a"), [], [])
    assert [small.get(t, "a") is not None for t in ("alice", "bob", "carol", "dave")] == [False, True, True, True]


def test_past_the_total_bound_the_fullest_tenant_loses_its_oldest_not_a_quiet_one() -> None:
    # four keys at their own byte bound fill the total; a fifth, quiet key's response (older, and never read again)
    # stays, as docs/server.md says: one key's traffic never pushes out another's
    size = len(json.dumps([_response("q0-00", "y" * 100), [], []], separators=(",", ":")))  # every entry's size
    store = ResponseStore(max_bytes=4 * size, max_total_bytes=16 * size)
    assert store.put("quiet", _response("q0-00", "y" * 100), [], []) and store.tenant_bytes("quiet") == size
    for i in range(10):
        for key in ("k1", "k2", "k3", "k4"):
            assert store.put(key, _response(f"{key}-{i:02}", "y" * 100), [], [])
            assert store.bytes <= 16 * size and store.get(key, f"{key}-{i:02}") is not None  # the newest stays
    assert store.get("quiet", "q0-00") is not None
    assert store.bytes == sum(store.tenant_bytes(t) for t in ("quiet", "k1", "k2", "k3", "k4")) <= 16 * size
    assert [store.tenant_bytes(t) // size for t in ("k1", "k2", "k3", "k4")] == [4, 4, 4, 3]  # k4's latest made 16


def test_a_tenant_never_reads_nor_deletes_another_tenants_response() -> None:
    store = ResponseStore()
    store.put("alice", _response("r"), [], [])
    assert store.get("bob", "r") is None and store.get(None, "r") is None
    assert not store.delete("bob", "r") and store.get("alice", "r") is not None


@pytest.mark.xdist_group("keyed_server")  # the shared server (conftest.py)
def test_over_http_one_key_cannot_read_continue_nor_delete_anothers_response(keyed_server) -> None:
    alice = openai.OpenAI(base_url=keyed_server.v1, api_key="sk-alice", max_retries=0, timeout=60)
    bob = openai.OpenAI(base_url=keyed_server.v1, api_key="sk-bob", max_retries=0, timeout=60)
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
    assert httpx.get(keyed_server.v1 + f"/responses/{r.id}", timeout=10).status_code == 401  # no key: refused first


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


def test_text_after_calls_joins_their_turn_as_in_the_whole_answers_order() -> None:
    """A stream lists a reply's items as the model wrote them: calls, then text written after them (Hermes models
    do), where the whole answer lists its message first. Replayed in the stream's order, the text was a second
    assistant message: another prompt than the whole answer's (and than the text the model wrote), so the cache
    missed from that turn on."""

    def conversation(reply: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[list[str]]]:
        raw = [
            {"role": "user", "content": "q"},
            *reply,
            {"type": "function_call_output", "call_id": "c1", "output": "3"},
        ]
        origins = [f"input.{i}" for i in range(len(raw))]
        return messages_of([item_of(item, o) for item, o in zip(raw, origins, strict=True)], origins, None)

    call = {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}", "id": "fc_1"}
    text = {"type": "message", "role": "assistant", "id": "msg_1", "content": [{"type": "output_text", "text": "ok"}]}
    whole, whole_sources = conversation([text, call])
    streamed, streamed_sources = conversation([call, text])
    assert streamed == whole
    assert [m["role"] for m in streamed] == ["user", "assistant", "tool"] and streamed[1]["content"] == "ok"
    assert whole_sources == [["input.0"], ["input.1", "input.2"], ["input.3"]]
    assert streamed_sources == [["input.0"], ["input.2", "input.1"], ["input.3"]]  # the text's item, then the call's
    assert renamed(APIError(400, "bad", param="messages.1.content"), streamed_sources).param == "input.2.content"
    # text the model wrote on both sides of its call: the stream's two messages are the whole answer's one
    before = {**text, "id": "msg_0", "content": [{"type": "output_text", "text": "on"}]}
    after = {**text, "content": [{"type": "output_text", "text": "ce"}]}
    both = {**text, "content": [{"type": "output_text", "text": "once"}]}
    assert conversation([before, call, after])[0] == conversation([both, call])[0]


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


def test_a_renamed_errors_message_names_the_responses_field_too() -> None:
    """The chat path's messages name their field as `messages[2].tool_calls[1]...`, beside the dotted `param`."""
    sources = [["instructions"], ["input.0"], ["input.1", "input.2", "input.3"]]
    chat = "messages[2].tool_calls[1].function.arguments"
    error = renamed(
        APIError(400, f"{chat}: is not valid JSON", param="messages.2.tool_calls.1.function.arguments"), sources
    )
    assert (error.param, error.message) == ("input.3.arguments", "input.3.arguments: is not valid JSON")
    error = renamed(APIError(400, "tools[1].function.name: 'f' is defined twice", param="tools.1.function.name"), [])
    assert error.message == "tools.1.name: 'f' is defined twice"


def test_a_replayed_reply_keeps_its_calls_cut_short() -> None:
    """A follow-up's history holds the reply as the model wrote it (the prompt then extends the cached one): a call
    cut short, or whose arguments hold NaN (no JSON to the tool-call parser), is replayed as a client would."""
    from radixcache.runtime.server.responses_output import arguments_closed

    whole = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'}
    cut = {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "f", "arguments": '{"a": '}
    nan = {"type": "function_call", "id": "fc_3", "call_id": "c3", "name": "f", "arguments": '{"a": NaN}'}
    assert [(i["id"], i["arguments"]) for i in replayed([whole, cut, nan])] == [
        ("fc_1", '{"a": 1}'),
        ("fc_2", '{"a": '),
        ("fc_3", '{"a": NaN}'),
    ]
    assert not arguments_closed('{"a": NaN}') and not arguments_closed('{"a": Infinity}')  # no call made
    assert arguments_closed('{"a": 1}')


class _Metrics:
    def __init__(self) -> None:
        self.observed, self.failures, self.requests_ok = 0, [], 0

    def observe(self, result: Any, namespace: Any) -> None:
        self.observed += 1

    def failed(self, status: int) -> None:
        self.failures.append(status)


def _result(text: str, finish: str, calls: tuple[ToolCall, ...] = ()) -> GenerationResult:
    return GenerationResult(text, (1, 2, 3), 10, 4, 6, 0.0, 0.0, finish, tool_calls=calls)


def _run(events: list[Any], fail: Exception | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    body = ResponsesRequest.model_validate({"model": "tiny", "input": "hi", "stream": True})
    stored: list[dict[str, Any]] = []
    stream = ResponseStream(ResponseBuilder(body, "tiny", 10), _Metrics(), None, stored.append)

    async def source() -> AsyncIterator[Any]:
        for event in events:
            yield event
        if fail is not None:
            raise fail

    async def collect() -> list[str]:
        return [line async for line in stream.sse(source())]

    lines = asyncio.run(collect())
    out = []
    for line in lines:
        head, data = line.split("\n")[:2]
        event = json.loads(data[len("data: ") :])
        assert head == f"event: {event['type']}"
        out.append(event)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out, stored


def test_a_stream_of_text_then_calls_streams_each_item_after_the_last_and_stores_the_response() -> None:
    call = ToolCall("call_1", "add", '{"a": 1}')
    events = [
        Event(0, "", deltas=({"content": "Let me "}, {"content": "add."})),
        Event(
            0,
            "",
            deltas=(
                {
                    "tool_calls": [
                        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": ""}}
                    ]
                },
            ),
        ),
        Event(0, "", deltas=({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]},)),
        Event(0, "", deltas=({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},)),
        Event(0, "", result=_result("Let me add.", "tool_calls", (call,))),
    ]
    out, stored = _run(events)
    assert [e["type"] for e in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = out[-1]["response"]
    message, function_call = final["output"]
    assert message["content"][0]["text"] == "Let me add." and message["status"] == "completed"
    assert (function_call["call_id"], function_call["arguments"], function_call["status"]) == (
        "call_1",
        '{"a": 1}',
        "completed",
    )
    assert out[9]["output_index"] == 1 and out[10]["item_id"] == function_call["id"]
    assert stored == [final] and final["usage"]["output_tokens"] == 3


def test_a_reply_cut_in_its_call_has_the_same_items_whole_as_streamed() -> None:
    """Only the item being written when the reply was cut is incomplete: the text before the call is done."""
    cut = _result("Let me add.", "length", (ToolCall("call_1", "add", '{"a": '),))
    events = [
        Event(0, "", deltas=({"content": "Let me add."},)),
        Event(0, "", deltas=({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "add"}}]},)),
        Event(0, "", deltas=({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]},)),
        Event(0, "", result=cut),
    ]
    out, _ = _run(events)
    streamed = out[-1]["response"]["output"]
    body = ResponsesRequest.model_validate({"model": "tiny", "input": "hi"})
    whole = ResponseBuilder(body, "tiny", 10).whole(cut)["output"]
    assert [(i["type"], i["status"]) for i in whole] == [("message", "completed"), ("function_call", "incomplete")]
    assert [(i["type"], i["status"]) for i in streamed] == [(i["type"], i["status"]) for i in whole]


def test_an_empty_reply_is_one_empty_message_and_a_cut_one_is_incomplete() -> None:
    out, _ = _run([Event(0, "", result=_result("", "length"))])
    assert out[-1]["type"] == "response.incomplete"
    assert out[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    (message,) = out[-1]["response"]["output"]
    assert message["content"][0]["text"] == "" and message["status"] == "incomplete"


def test_a_failure_mid_stream_is_an_error_event_then_response_failed_and_nothing_is_stored() -> None:
    out, stored = _run([Event(0, "par")], fail=QueueFullError("full", retry_after=1.0))
    assert [e["type"] for e in out[-2:]] == ["error", "response.failed"]
    assert out[-2]["code"] == "queue_full" and out[-1]["response"]["status"] == "failed"
    assert out[-1]["response"]["error"]["code"] == "queue_full" and stored == []


def test_a_reply_cut_in_text_after_its_call_marks_that_text_not_the_call_incomplete() -> None:
    """Hermes text on both sides of a call, cut at every byte: the stream (the parser's deltas) and the whole answer
    (its calls parsed, `ends_in_text` parsing its raw text again) agree on each call's status and on whether the
    text is incomplete: the call is complete once its arguments closed, the text once it is no longer written."""
    from types import SimpleNamespace

    from radixcache.runtime.server.generation import ends_in_text
    from radixcache.runtime.tools import ToolCallParser, parse_tool_calls
    from radixcache.runtime.tools.specs import normalize_tools
    from tests.tiny_tools import TOOLS

    tools = normalize_tools(TOOLS)
    raw = 'Checking.<tool_call>{"name": "now", "arguments": {}}</tool_call> Done.'
    closed, after = raw.index("{}}") + 2, raw.index("Done")
    use = SimpleNamespace(tools=tools, parses_calls=True, max_calls=None, calls_only=False, forced=None)
    job = SimpleNamespace(options=SimpleNamespace(tool_use=use, sampling=SimpleNamespace(stop=(), stop_token_ids=())))
    job.tool_format, job.prompts = "hermes", [[]]  # no prompt: the stub decoder gives the text alone
    job.call_tokens = frozenset()
    body = ResponsesRequest.model_validate({"model": "tiny", "input": "hi"})
    for n in range(len("Checking.") + 1, len(raw) + 1):
        parser = ToolCallParser(tools, "hermes", new_id=lambda: "call_1")
        events = [Event(0, "", deltas=tuple(parser.feed(ch))) for ch in raw[:n]]
        parsed = parse_tool_calls(raw[:n], tools, "hermes", new_id=lambda: "call_1")
        cut = _result(parsed.content or "", "length", parsed.tool_calls)
        events.append(Event(0, "", result=cut, deltas=tuple(parser.finish())))
        streamed = _run(events)[0][-1]["response"]["output"]
        engine = SimpleNamespace(eos_token_ids=(), tokenizer=SimpleNamespace(decode=lambda _ids, n=n, **_: raw[:n]))
        whole = ResponseBuilder(body, "tiny", 10).whole(cut, ends_in_text(engine, job, cut))["output"]
        calls = [(i["call_id"], i["status"]) for i in whole if i["type"] == "function_call"]
        assert calls == [(i["call_id"], i["status"]) for i in streamed if i["type"] == "function_call"], n
        assert calls == ([("call_1", "completed" if n >= closed else "incomplete")] if calls else []), n
        texts = [i["status"] for i in whole if i["type"] == "message"]
        assert texts == ["incomplete" if n > after or not calls else "completed"], n
        assert [i["status"] for i in streamed if i["type"] == "message"][-1] == texts[0], n
