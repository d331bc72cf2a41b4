"""A streamed Responses answer keeps its message's text and a call's arguments in pieces, joined when the item
closes: each delta was put on the whole text (or arguments) so far, a copy of it per delta, quadratic in a long
answer. Counted, not timed: each delta is a `str` subclass whose reflected `+` counts the characters it is put on
(`so_far + piece` asks the subclass first). The items still hold the whole text, also in a response that failed."""

from __future__ import annotations

from typing import Any

from radixcache.runtime.engine.errors import QueueFullError
from radixcache.runtime.server.generation import Event
from radixcache.runtime.tools import ToolCall
from tests.server.test_responses_api_parts import _result, _run

PIECES = 3000


class Piece(str):
    """A delta that counts the characters it is appended to."""

    joined_onto = 0

    def __radd__(self, other: Any) -> str:
        Piece.joined_onto += len(other)
        return str.__add__(other, self)


def call_events(arguments: list[str]) -> list[Event]:
    first = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": ""}}
    events = [Event(0, "", deltas=({"tool_calls": [first]},))]
    for piece in arguments:
        events.append(Event(0, "", deltas=({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]},)))
    return events


def test_a_long_message_and_call_stream_in_linear_work() -> None:
    Piece.joined_onto = 0
    text = [Piece(f"w{i % 10} ") for i in range(PIECES)]
    arguments = [Piece('{"a": "'), *(Piece("xy") for _ in range(PIECES)), Piece('"}')]
    whole_args = "".join(arguments)
    call = ToolCall("call_1", "add", whole_args)
    events = [Event(0, t) for t in text] + call_events(arguments)
    events.append(Event(0, "", result=_result("".join(text), "tool_calls", (call,))))
    out, stored = _run(events)
    # before: each piece was put on all before it, about PIECES**2 characters copied
    assert Piece.joined_onto <= 4 * (len("".join(text)) + len(whole_args)), Piece.joined_onto
    message, made = stored[0]["output"]
    assert message["content"][0]["text"] == "".join(text)
    assert made["arguments"] == whole_args and made["status"] == "completed"
    done = [e for e in out if e["type"] == "response.function_call_arguments.done"]
    assert [e["arguments"] for e in done] == [whole_args]


def test_a_stream_that_fails_mid_call_shows_the_arguments_written_so_far() -> None:
    arguments = ['{"a": ', "1", ", "]
    out, _ = _run(call_events(arguments), fail=QueueFullError("full", retry_after=1.0))
    assert out[-1]["type"] == "response.failed"
    (item,) = out[-1]["response"]["output"]
    assert item["type"] == "function_call" and item["arguments"] == "".join(arguments)
