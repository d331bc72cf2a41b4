"""Text traces, parsed into plain `Conversation` records that the runtime tokenises later.

Three input formats:
- ShareGPT, as one JSON array or as JSONL: `{"id", "conversations": [{"from": "human"|"gpt"|"system", "value"}]}`
- the project's conversation JSONL, one conversation per line: `id`, optional `system`, and `turns`, each with
  `user`, an optional recorded `assistant` and an optional `max_tokens`
- OpenAI-style requests, one per line: `{"messages": [{"role", "content"}], "max_tokens"?}`

Each becomes a `Conversation`; writing always produces the conversation JSONL.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixcache.trace.errors import TraceError
from radixcache.trace.fields import FieldReader
from radixcache.trace.jsonl import dump_json_line, iter_json_array, iter_json_lines, lone_surrogate, open_trace

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


@dataclass(frozen=True, slots=True)
class Turn:
    """One user message, the recorded assistant reply (if any) and a generation limit (if any)."""

    user: str
    assistant: str | None = None
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation: an id, an optional system prompt, and its turns in order."""

    id: str
    turns: tuple[Turn, ...]
    system: str | None = None


def conversation_to_dict(conversation: Conversation) -> dict[str, Any]:
    out: dict[str, Any] = {"id": conversation.id}
    if conversation.system is not None:
        out["system"] = conversation.system
    turns = []
    for turn in conversation.turns:
        item: dict[str, Any] = {"user": turn.user}
        if turn.assistant is not None:
            item["assistant"] = turn.assistant
        if turn.max_tokens is not None:
            item["max_tokens"] = turn.max_tokens
        turns.append(item)
    out["turns"] = turns
    return out


def write_conversations(path: str | Path, conversations: Iterable[Conversation]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as handle:
        for conversation in conversations:
            handle.write(dump_json_line(conversation_to_dict(conversation)))
            n += 1
    return n


# ---------------------------------------------------------------------- the project's conversation JSONL


def iter_conversations(path: str | Path) -> Iterator[Conversation]:
    name = str(path)
    for lineno, record in iter_json_lines(path):
        fields = FieldReader(name, str(lineno), record)
        raw_turns = fields.items("turns", lambda t: isinstance(t, dict), "an object")
        if not raw_turns:
            fields.fail("must hold at least one turn", "turns")
        turns = []
        for index, raw in enumerate(raw_turns):
            user, assistant = raw.get("user"), raw.get("assistant")
            if not isinstance(user, str):
                fields.fail(f"expected a string, got {type(user).__name__}", f"turns[{index}].user")
            if assistant is not None and not isinstance(assistant, str):
                fields.fail(f"expected a string, got {type(assistant).__name__}", f"turns[{index}].assistant")
            limit = raw.get("max_tokens")
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
                fields.fail(f"expected a positive integer, got {limit!r}", f"turns[{index}].max_tokens")
            turns.append(Turn(user, assistant, limit))
        yield Conversation(id=_id(fields, f"line-{lineno}"), turns=tuple(turns), system=fields.text("system", None))


# ---------------------------------------------------------------------- ShareGPT


def iter_sharegpt(path: str | Path, *, array: bool | None = None) -> Iterator[Conversation]:
    """ShareGPT as a JSON array (array=True), JSONL (False), or whichever the file starts with (None)."""
    name = str(path)
    if array is None:
        if os.path.exists(path) and not os.path.isfile(path):  # peeking at a pipe's start would take it away
            raise TraceError(name, "format", "a ShareGPT trace must be a regular file, not a pipe: save it to a file")
        array = _first_char(path) == "["
    source = iter_json_array(path) if array else iter_json_lines(path)
    for position, (lineno, record) in enumerate(source, 1):
        fields = FieldReader(name, str(lineno), record)
        messages = fields.items("conversations", lambda m: isinstance(m, dict), "an object")
        pairs: list[tuple[str, str]] = []
        for index, message in enumerate(messages):
            role = message.get("from")
            value = message.get("value")
            if role not in _SHAREGPT_ROLES:
                fields.fail(f"unknown speaker {role!r} (expected human, gpt or system)", f"conversations[{index}].from")
            if not isinstance(value, str):
                fields.fail(f"expected a string, got {type(value).__name__}", f"conversations[{index}].value")
            if (bad := lone_surrogate(value)) is not None:  # an array's JSON parser takes "\ud83d"; orjson does not
                fields.fail(f"holds a lone surrogate {bad!r}: not valid Unicode", f"conversations[{index}].value")
            pairs.append((_SHAREGPT_ROLES[role], value))
        # An array's records may share a line (a minified file): a default id by line would repeat, so it counts them.
        default = f"conversation-{position}" if array else f"line-{lineno}"
        yield _from_messages(fields, pairs, "conversations", _id(fields, default), None)


# ---------------------------------------------------------------------- OpenAI messages


def iter_openai(path: str | Path) -> Iterator[Conversation]:
    """One OpenAI chat request per line; its messages become the turns, the last one waiting for a reply."""
    name = str(path)
    for lineno, record in iter_json_lines(path):
        fields = FieldReader(name, str(lineno), record)
        messages = fields.items("messages", lambda m: isinstance(m, dict), "an object")
        pairs = []
        for index, message in enumerate(messages):
            role = message.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                fields.fail(f"unknown role {role!r}", f"messages[{index}].role")
            content = _openai_content(fields, message.get("content"), f"messages[{index}].content")
            if message.get("content") == [] and role != "assistant":  # the server's 400 (an empty array: OpenAI's)
                fields.fail(f"an empty list of parts on a {role} message", f"messages[{index}].content")
            pairs.append(("system" if role == "developer" else role, content))
        legacy, limit = _positive(fields, "max_tokens"), _positive(fields, "max_completion_tokens")
        if None not in (legacy, limit) and legacy != limit:  # the server's 400, OpenAI's: which limit replays?
            fields.fail(f"max_tokens {legacy} and max_completion_tokens {limit} differ", "max_tokens")
        limit = limit or legacy
        yield _from_messages(fields, pairs, "messages", _id(fields, f"line-{lineno}"), limit)


def _openai_content(fields: FieldReader, content: Any, field: str) -> str:
    """A message's text: a string, or its text parts joined. Any other part (an image, audio) is refused naming it,
    as the server refuses it: read as "" it replayed another prompt than the trace's, without a word."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        fields.fail("expected a string or a list of text parts", field)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            fields.fail(
                f"only text parts ({{'type': 'text', 'text': ...}}) can be replayed, got {kind!r}", f"{field}[{j}]"
            )
        if not isinstance(part.get("text"), str):
            fields.fail(f"expected a string, got {type(part.get('text')).__name__}", f"{field}[{j}].text")
        parts.append(part["text"])
    return "".join(parts)


# ---------------------------------------------------------------------- helpers


def _from_messages(
    fields: FieldReader, messages: list[tuple[str, str]], field: str, conv_id: str, last_limit: int | None
) -> Conversation:
    """Fold (role, text) messages into turns: optional leading system, then user (assistant)? pairs."""
    system = None
    start = 0
    if messages and messages[0][0] == "system":
        system, start = messages[0][1], 1
    turns: list[Turn] = []
    pending: str | None = None
    for index in range(start, len(messages)):
        role, text = messages[index]
        if role == "user" and pending is None:
            pending = text
        elif role == "assistant" and pending is not None:
            turns.append(Turn(pending, text))
            pending = None
        else:
            expected = "a user message" if pending is None else "an assistant reply"
            fields.fail(f"{role} message where {expected} was expected", f"{field}[{index}]")
    if pending is not None:
        turns.append(Turn(pending, None, last_limit))
    if not turns:
        fields.fail("holds no user message", field)
    return Conversation(id=conv_id, turns=tuple(turns), system=system)


def _id(fields: FieldReader, default: str) -> str:
    value = fields.record.get("id")
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        fields.fail(f"expected a string or integer, got {type(value).__name__}", "id")
    return str(value)


def _positive(fields: FieldReader, field: str) -> int | None:
    value = fields.record.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fields.fail(f"expected a positive integer, got {value!r}", field)
    return value


def _first_char(path: str | Path) -> str:
    """The first character past leading whitespace ("" for none), read as bytes: a file that is not UTF-8 is the
    reader's to report, at its line."""
    with open_trace(path, "rb") as handle:
        while True:
            chunk = handle.read(4096)
            if not chunk:
                return ""
            stripped = chunk.lstrip()
            if stripped:
                return chr(stripped[0])
