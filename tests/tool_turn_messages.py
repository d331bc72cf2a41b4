"""The chat messages the tool-turn tests build histories from, in the Python API (tests/runtime/structured) and over
HTTP (tests/server): a user's question, an assistant message of calls, a tool's result, and a call the length limit
cut inside its arguments."""

from __future__ import annotations

from typing import Any

ASK = {"role": "user", "content": "Weather in Oslo, and 2 + 3?"}
AGAIN = {"role": "user", "content": "Go on."}
WEATHER = '{"city": "Oslo", "unit": "c"}'
CUT = '{"city": "Os'  # a call the length limit cut inside its arguments


def call(call_id: str, arguments: str = WEATHER, name: str = "get_weather") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def calls(*made: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": list(made)}


def result(call_id: str, content: Any = "3 C") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}
