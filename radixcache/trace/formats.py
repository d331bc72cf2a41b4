"""Trace formats: names, detection from a file's extension and first record, and one `read_trace` for all."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from radixcache.trace.errors import TraceError
from radixcache.trace.jsonl import BOM, MAX_LINE_BYTES, compressed, first_line
from radixcache.trace.mooncake import iter_mooncake
from radixcache.trace.replay_output import starts_replay_json
from radixcache.trace.text import iter_conversations, iter_openai, iter_sharegpt
from radixcache.trace.token_trace import iter_token_jsonl, iter_token_msgpack

TOKEN_JSONL = "token-jsonl"
TOKEN_MSGPACK = "token-msgpack"
MOONCAKE = "mooncake"
SHAREGPT = "sharegpt"
CONVERSATIONS = "conversations"
OPENAI = "openai"

#: format name -> kind of record it holds: "token" (TokenRequest), "hash" (HashRequest), "text" (Conversation)
FORMAT_KINDS = {
    TOKEN_JSONL: "token",
    TOKEN_MSGPACK: "token",
    MOONCAKE: "hash",
    SHAREGPT: "text",
    CONVERSATIONS: "text",
    OPENAI: "text",
}
FORMATS = tuple(FORMAT_KINDS)
_MSGPACK_SUFFIXES = (".msgpack", ".mpk", ".mp")
_KEY_FORMATS = (("hash_ids", MOONCAKE), ("tokens", TOKEN_JSONL), ("conversations", SHAREGPT), ("turns", CONVERSATIONS))


class Trace(NamedTuple):
    """A whole trace in memory: its format, the kind of its records, and the records in file order."""

    format: str
    kind: str
    records: list


def detect_format(path: str | Path) -> str:
    """The format of a trace file, from its extension (msgpack) or its first record's keys."""
    name = str(path)
    if name.lower().endswith(_MSGPACK_SUFFIXES):
        return TOKEN_MSGPACK
    if os.path.exists(path) and not os.path.isfile(path):  # a pipe: what detection reads, the reader then lacks
        raise TraceError(name, "format", "not a regular file (a pipe?): its format cannot be detected, pass --format")
    try:
        with open(path, "rb") as handle:
            head = handle.read(1 << 16)
    except OSError as exc:
        raise TraceError(name, "open", exc.strerror or str(exc)) from None
    if (problem := compressed(head)) is not None:
        raise TraceError(name, "1", problem)
    if head[:1] and (0x80 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF)):
        return TOKEN_MSGPACK  # a msgpack map header: a fixmap (0 to 15 keys: a record has up to 7), map16 or map32
    text = head.removeprefix(BOM).decode("utf-8", errors="replace").lstrip()
    if text.startswith("["):
        return SHAREGPT
    first = first_line(path)
    if first is None and head.removeprefix(BOM).strip():  # there is a record, on a line too long to take
        raise TraceError(name, "format", f"cannot detect the format: its first line is over {MAX_LINE_BYTES:,} bytes")
    if first is None:
        raise TraceError(name, "1", "empty file: cannot detect the trace format (pass --format)")
    first_line_text = first.decode("utf-8", errors="replace")
    if starts_replay_json(first_line_text):  # it was "invalid JSON" (the object spans lines) or "expected a record"
        raise TraceError(
            name,
            "format",
            "this is the output of 'radixcache replay --json', not a trace: 'radixcache trace stats' reads it; "
            "pass the trace that was replayed (or one 'replay --record-trace' wrote)",
        )
    try:
        record = json.loads(first_line_text)
    except json.JSONDecodeError as exc:
        raise TraceError(name, "1", f"cannot detect the format: invalid JSON ({exc.msg})") from None
    if isinstance(record, dict):
        if "messages" in record:
            return OPENAI
        for key, fmt in _KEY_FORMATS:
            if key in record:
                return fmt
    raise TraceError(
        name, "1", "cannot detect the format: expected a record with hash_ids, tokens, conversations, turns or messages"
    )


def iter_trace(path: str | Path, format: str | None = None, *, block_size: int | None = None) -> Iterator:
    """Records of a trace, streamed. `format` None means detect; block_size checks Mooncake hash_ids lengths."""
    fmt = format or detect_format(path)
    if fmt == TOKEN_JSONL:
        return iter_token_jsonl(path)
    if fmt == TOKEN_MSGPACK:
        return iter_token_msgpack(path)
    if fmt == MOONCAKE:
        return iter_mooncake(path, block_size)
    if fmt == SHAREGPT:
        return iter_sharegpt(path)
    if fmt == CONVERSATIONS:
        return iter_conversations(path)
    if fmt == OPENAI:
        return iter_openai(path)
    raise TraceError(str(path), "format", f"unknown trace format {fmt!r}; choose one of {', '.join(FORMATS)}")


def read_trace(path: str | Path, format: str | None = None, *, block_size: int | None = None) -> Trace:
    """A whole trace in memory (see `iter_trace`)."""
    fmt = format or detect_format(path)
    records = list(iter_trace(path, fmt, block_size=block_size))
    return Trace(fmt, FORMAT_KINDS[fmt], records)
