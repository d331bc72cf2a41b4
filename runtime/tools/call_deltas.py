"""The two deltas every call syntax's parser streams for a call (`parse.ToolCallParser`, `parse_command_r`), in
OpenAI's chat-completion chunk shape: a call's head (id, type, name, empty arguments), then pieces of its arguments.
`calls` holds each call found as (id, name, its argument pieces); a delta's `index` is the call's place there."""

from __future__ import annotations

from typing import Any

Call = tuple[str, str, list[str]]


def open_call(calls: list[Call], call_id: str, name: str) -> dict[str, Any]:
    """A new call's first delta; the call joins `calls`."""
    calls.append((call_id, name, []))
    head = {"name": name, "arguments": ""}
    return {"tool_calls": [{"index": len(calls) - 1, "id": call_id, "type": "function", "function": head}]}


def argument_piece(calls: list[Call], piece: str) -> dict[str, Any]:
    """The last call's next piece of arguments as a delta; the piece joins the call."""
    calls[-1][2].append(piece)
    return {"tool_calls": [{"index": len(calls) - 1, "function": {"arguments": piece}}]}
