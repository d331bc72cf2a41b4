"""Chat histories as agent frameworks send them, validated into frozen `ChatMessage`s.

Accepted: roles system, developer (treated as system), user, assistant, tool; `content` a string, a list of text
parts (`{"type": "text", "text": ...}`, joined), or null on an assistant message (an assistant message with
`tool_calls` usually has null content; an empty list of parts is null: no content on an assistant message, a
`ToolInputError` on any other, as OpenAI refuses an empty array); `name` on any message; `tool_calls` on assistant
messages (`{"id", "type": "function", "function": {"name", "arguments"}}`, arguments a JSON object, no NaN nor
Infinity, or any text, kept as written; empty text or null for none); a tool message needs `tool_call_id`. Anything
else raises `ToolInputError` naming `messages[i].field`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixcache.runtime.tools.errors import ToolInputError

ROLES = ("system", "developer", "user", "assistant", "tool")


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


# JSON as RFC 8259 has it: Python's decoder also reads NaN and Infinity, which a call's arguments would then carry
# into a prompt (a history's) or to clients whose parsers refuse them (the model's)
STRICT_JSON = json.JSONDecoder(parse_constant=_no_constant)


def _js_number(text: str) -> float:
    """A JSON number as the double JavaScript reads it, -0 as 0: JSON.stringify then writes `1.0` as `1`, `1e5` as
    `100000` and `-0` as `0`, one value each. A number past the doubles (1e309: JavaScript's Infinity, which
    JSON.stringify writes as null) is a ValueError: read as infinity, every such number was one value, and two calls
    with different huge numbers one call."""
    number = float(text) + 0.0
    if math.isinf(number):
        raise ValueError(f"{text[:20]} is past the doubles")
    return number


# Whether text is JSON, whatever its integers' length: Python's int() refuses more than 4,300 digits (a ValueError),
# which JSON allows and a model may write; the digits are kept as text, never converted
JSON_CHECK = json.JSONDecoder(parse_constant=_no_constant, parse_int=str)


# Arguments as the values a client holds: a JS client that keeps a call's arguments as an object (the Vercel AI SDK)
# sends them back through JSON.stringify, whose numbers are those doubles
_VALUES = json.JSONDecoder(parse_constant=_no_constant, parse_int=_js_number, parse_float=_js_number)


@dataclass(frozen=True)
class ToolCall:
    """One call: `arguments` is the JSON text of an object, as OpenAI returns it."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def same_call(self, other: ToolCall) -> bool:
        """Same name and equal arguments (as JSON values, whatever their whitespace, escapes or key order)."""
        return self.name == other.name and canonical_arguments(self.arguments) == canonical_arguments(other.arguments)


@dataclass(frozen=True)
class ChatMessage:
    """role is one of system, user, assistant, tool (developer became system); content None only on an
    assistant message."""

    role: str
    content: str | None
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


def canonical_arguments(arguments: str) -> str:
    """Arguments as one text per JSON value (text that is no JSON: itself, prefixed so no JSON text is the same;
    empty text is `{}`, as `call_arguments` reads it: a call the length limit cut after its name has "" arguments,
    which a history replays as `{}`), a number being the double JavaScript reads (`1.0`, `1` and `1e0` are one:
    a JS client that rebuilt the arguments with JSON.stringify sends the same values; arguments holding a number past
    the doubles, which JavaScript cannot hold, are compared as their text). Python's == on the decoded
    values would not do: it holds `true` equal to `1`, so a call replayed with other arguments would pass for the
    one the model wrote."""
    if not arguments.strip(" \t\n\r"):
        arguments = "{}"
    try:
        return json.dumps(_VALUES.decode(arguments), sort_keys=True)
    except (ValueError, RecursionError):
        return "text:" + arguments


def _as_dict(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(exclude_none=True) if callable(dump) else value


def _content(value: Any, path: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        texts = []
        for j, part in enumerate(value):
            part = _as_dict(part)
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ToolInputError(f"{path}[{j}]", f"only text parts ({{'type': 'text', 'text': ...}}), got {kind!r}")
            if not isinstance(part.get("text"), str):
                raise ToolInputError(f"{path}[{j}].text", f"must be a string, got {type(part.get('text')).__name__}")
            texts.append(part["text"])
        return "".join(texts)
    raise ToolInputError(path, f"must be a string or a list of text parts, got {type(value).__name__}")


def _tool_call(raw: Any, path: str) -> ToolCall:
    call = _as_dict(raw)
    if not isinstance(call, dict):
        raise ToolInputError(path, "must be an object")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise ToolInputError(f"{path}.id", "must be a non-empty string")
    if call.get("type", "function") != "function":
        raise ToolInputError(f"{path}.type", f"must be 'function', got {call.get('type')!r}")
    fn = _as_dict(call.get("function"))
    if not isinstance(fn, dict):
        raise ToolInputError(f"{path}.function", "must be an object with 'name' and 'arguments'")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ToolInputError(f"{path}.function.name", "must be a non-empty string")
    return ToolCall(call_id, name, call_arguments(fn.get("arguments", "{}"), f"{path}.function.arguments"))


def call_arguments(arguments: Any, path: str) -> str:
    """A history's call arguments as text: text as written, JSON or not (OpenAI takes any string: a call the length
    limit cut, replayed as received, renders as the model wrote it, so the conversation goes on and its prompt is the
    one the cache holds; so does `{"a": NaN}`, text like any other, never read as a number); an object as its JSON
    text (`ToolInputError` naming `path` when it holds what JSON cannot write: NaN, Infinity, a set). Empty text (or
    only whitespace) and null are no arguments, "{}": clients write them for a call without parameters (OpenRouter's
    models, Continue)."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip(" \t\n\r")):
        return "{}"
    if isinstance(arguments, str):
        return arguments
    if not isinstance(arguments, dict):
        raise ToolInputError(path, "must be a JSON object or its text")
    try:
        return json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:  # a value JSON cannot write: a set, bytes, NaN, Infinity
        raise ToolInputError(path, f"is not valid JSON ({e})") from None
    except RecursionError:
        raise ToolInputError(path, "is nested too deeply to read") from None


def decoded_arguments(arguments: str) -> Any:
    """The arguments as the JSON object they are, for templates that take them as objects; else the text as written
    (not JSON: a call cut short, NaN; or JSON that is no object)."""
    try:
        value = STRICT_JSON.decode(arguments)
    except (ValueError, RecursionError):
        return arguments
    return value if isinstance(value, dict) else arguments


def normalize_message(raw: Any, index: int) -> ChatMessage:
    """One message; errors name `messages[index].field`."""
    msg, here = _as_dict(raw), f"messages[{index}]"
    if not isinstance(msg, dict):
        raise ToolInputError(here, f"must be a dict with a 'role', got {type(msg).__name__}")
    role = msg.get("role")
    if role not in ROLES:
        raise ToolInputError(f"{here}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    name = msg.get("name")
    if name is not None and not isinstance(name, str):
        raise ToolInputError(f"{here}.name", "must be a string")
    calls: tuple[ToolCall, ...] = ()
    raw_calls = msg.get("tool_calls")
    if raw_calls is not None:
        if role != "assistant":
            raise ToolInputError(f"{here}.tool_calls", "only assistant messages carry tool_calls")
        if not isinstance(raw_calls, (list, tuple)):
            raise ToolInputError(f"{here}.tool_calls", "must be a list")
        calls = tuple(_tool_call(c, f"{here}.tool_calls[{j}]") for j, c in enumerate(raw_calls))
    content = msg.get("content")
    if isinstance(content, (list, tuple)) and not content:  # no parts is no content: what null is (OpenAI: a 400)
        if role != "assistant":
            raise ToolInputError(f"{here}.content", f"must not be an empty list of parts on a {role} message")
        content = None
    if content is None:
        if role != "assistant":
            raise ToolInputError(f"{here}.content", f"is required on a {role} message")
        text: str | None = None
    else:
        text = _content(content, f"{here}.content")
    call_id = msg.get("tool_call_id")
    if role == "tool":
        if not isinstance(call_id, str) or not call_id:
            raise ToolInputError(f"{here}.tool_call_id", "a tool message needs the id of the call it answers")
    elif call_id is not None:
        raise ToolInputError(f"{here}.tool_call_id", "only tool messages carry tool_call_id")
    return ChatMessage("system" if role == "developer" else role, text, name, calls, call_id)


def normalize_messages(messages: Sequence[Any]) -> tuple[ChatMessage, ...]:
    """Every message validated; a tool message's name is filled in from the call it answers when missing."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ToolInputError("messages", "must be a list of messages")
    out = [normalize_message(m, i) for i, m in enumerate(messages)]
    names: dict[str, str] = {}
    for i, m in enumerate(out):
        names.update((c.id, c.name) for c in m.tool_calls)
        if m.role == "tool" and m.name is None and m.tool_call_id in names:
            out[i] = ChatMessage("tool", m.content, names[m.tool_call_id], (), m.tool_call_id)
    return tuple(out)
