"""JSONL trace lines decoded and validated in C (msgspec), with the readers' own checks as the word on every error.

A line of a Mooncake or token trace is decoded straight into a `MooncakeLine` or `TokenLine` whose field types carry
the same rules as the readers' FieldReader checks (non-negative ints, ids below 2**63, numbers for timestamps,
strings for ids of sessions). When msgspec refuses a line, the line is read again by the reader's own code
(`fallback`): that either raises the reader's TraceError at file:line, worded as it always was, or accepts a line
msgspec is stricter about (say, a timestamp past 2**64, which orjson reads as a float). So the values, and every
error and its order, are those of the readers; only the speed differs (about 2 µs for a 37-id line, against 15).
msgspec keeps the last of a key given twice, without a word: a line with more quote marks than its record's fields
account for (`_quotes`) is read by the fallback too, which refuses a repeated key at its file:line.

The field types must never accept what the fallback refuses: tests/trace/test_typed_lines.py checks the two on
generated lines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, ClassVar, TypeVar

import msgspec

from radixcache.trace.fields import MAX_TIMESTAMP_MS
from radixcache.trace.jsonl import open_trace, read_lines

# Token and hash ids must fit an int64. Counts may not be larger (msgspec bounds are int64): a larger one, which
# the readers take, goes to the fallback.
Id = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Count = Id
Timestamp = Count | Annotated[float, msgspec.Meta(ge=0, le=MAX_TIMESTAMP_MS)]  # an int stays an int, as orjson does


class MooncakeLine(msgspec.Struct, frozen=True):
    """One line of a Mooncake hash-block trace (radixcache.trace.mooncake), fields as the line gives them."""

    TEXT_FIELDS: ClassVar[tuple[str, ...]] = ("session_id",)  # the string fields (each value adds two quotes)

    timestamp: Timestamp
    input_length: Count
    hash_ids: tuple[Id, ...]
    output_length: Count | None = None  # None: absent or null (the reader's default, 0)
    output_hash_ids: tuple[Id, ...] | None = None
    session_id: str | None = None
    block_size: Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)] | None = None
    finish_timestamp: Timestamp | None = None
    retain_for: Annotated[int, msgspec.Meta(ge=0, le=10**9)] | Annotated[float, msgspec.Meta(ge=0, le=1e9)] | None = (
        None
    )


class TokenLine(msgspec.Struct, frozen=True):
    """One line of a token trace (radixcache.trace.token_trace), fields as the line gives them."""

    TEXT_FIELDS: ClassVar[tuple[str, ...]] = ("session", "namespace")

    timestamp: Timestamp
    tokens: tuple[Id, ...]
    output_length: Count
    session: str | None = None
    namespace: str | None = None
    output_tokens: tuple[Id, ...] | None = None
    retain_for: Annotated[int, msgspec.Meta(ge=0, le=10**9)] | Annotated[float, msgspec.Meta(ge=0, le=1e9)] | None = (
        None
    )


Line = TypeVar("Line", MooncakeLine, TokenLine)


def iter_typed_lines(
    path: str | Path, kind: type[Line], fallback: Callable[[str, int, bytes], Line]
) -> Iterator[tuple[int, Line]]:
    """(line number, decoded line) for every non-blank line of a JSONL file, streamed. A line msgspec refuses goes
    to `fallback(path, lineno, line)`, which raises the reader's TraceError or returns the line as the reader
    reads it."""
    name = str(path)
    decode = msgspec.json.Decoder(kind).decode
    texts, astuple = kind.TEXT_FIELDS, msgspec.structs.astuple
    with open_trace(path, "rb") as handle:
        for lineno, line in read_lines(handle, name):
            try:
                record = decode(line)
                if not line.isascii():  # msgspec skips an unknown field's string unread: its bytes too must be UTF-8
                    line.decode("utf-8")
            except (msgspec.MsgspecError, UnicodeDecodeError):
                if not line.strip():
                    continue
                record = fallback(name, lineno, line)
            else:  # a key given twice (msgspec keeps the last), an unknown key, a null, a string: more quote marks
                values, quotes = astuple(record), line.count(b'"')
                if quotes != 2 * (len(values) - values.count(None)) and quotes != _quotes(record, texts):
                    record = fallback(name, lineno, line)  # which refuses a repeated key, or reads the line as msgspec
            yield lineno, record


def _quotes(record: msgspec.Struct, texts: tuple[str, ...]) -> int:
    """The quote marks a line holding exactly `record`'s fields has: two per key, two per string value. msgspec keeps
    the last of a repeated key silently; a line with more quotes than this goes to the reader's own code, which
    refuses a repeated key (and reads a line with an unknown key, a null or an escaped quote as msgspec did)."""
    values = msgspec.structs.astuple(record)
    quotes = 2 * (len(values) - values.count(None))
    for field in texts:
        if getattr(record, field) is not None:
            quotes += 2
    return quotes
