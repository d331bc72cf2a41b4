"""Mooncake hash-block traces (FAST'25 release format), read as they are.

Each line: `{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}`. Each hash
id stands for one block of `block_size` tokens (512 in the Mooncake release): a request's hash ids are the chain
of its prefix blocks, and the last block holds only what input_length leaves. The simulator maps each hash id
to one cache page, so that hit tokens are counted exactly.

Optional fields, written by `radixcache replay --record-trace` and `serve --record-trace` (docs/traces.md):
`block_size` (tokens per hash id; when one line gives it, every line must, the same value), `output_hash_ids`
(the chained hashes of the pages the engine's tree got after the prompt's whole pages: the generated ones, which a
next turn reads), `session_id` (the conversation the request belongs to) and `finish_timestamp` (when the request
left the engine, in the timestamps' milliseconds: never before its timestamp).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from radixcache.errors import RadixCacheError
from radixcache.trace.errors import TraceError
from radixcache.trace.fields import FieldReader
from radixcache.trace.jsonl import dump_json_line, first_line, json_line
from radixcache.trace.typed_lines import MooncakeLine, iter_typed_lines

DEFAULT_BLOCK_SIZE = 512


@dataclass(frozen=True, slots=True)
class HashRequest:
    """One request of a hash-block trace. hash_ids[i] names the block of prompt tokens [i*bs, (i+1)*bs).

    The optional fields come from a recorded trace: `block_size` as the line gives it, `output_hash_ids` the pages
    the engine's tree got past the prompt's whole pages (None when the line has none), `session_id` its session,
    `finish_timestamp_ms` when it left the engine, `retain_for` its lease hint in seconds (runtime.kv.leases).
    """

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    block_size: int | None = None
    output_hash_ids: tuple[int, ...] | None = None
    session_id: str | None = None
    finish_timestamp_ms: float | None = None
    retain_for: float | None = None

    def block_tokens(self, index: int, block_size: int) -> int:
        """Tokens of block `index`: block_size, except the last, which holds what input_length leaves."""
        return max(0, min(block_size, self.input_length - index * block_size))


def check_block_size(request: HashRequest, block_size: int) -> str | None:
    """Why `request` is inconsistent with `block_size`, or None when each hash id covers a non-empty block."""
    blocks = len(request.hash_ids)
    need = -(-request.input_length // block_size)
    if blocks != need:
        return (
            f"{blocks} hash ids, but input_length {request.input_length} at block size {block_size} needs {need} blocks"
        )
    return None


def check_output_pages(request: HashRequest, block_size: int) -> str | None:
    """Why `request`'s output_hash_ids are more than its lengths allow, or None. The engine records one id per whole
    page it computed past the prompt's whole pages, which input_length + output_length tokens bound."""
    out = request.output_hash_ids
    if out is None:
        return None
    length, output = request.input_length, request.output_length
    most = max(0, (length + output) // block_size - length // block_size)
    if len(out) > most:
        return (
            f"{len(out)} ids, but input_length {length} and output_length {output} at block size {block_size} leave "
            f"at most {most} whole pages past the prompt's"
        )
    return None


class BlockSizes:
    """The `block_size` field of one trace, checked line by line: when the first line gives it, every line must give
    the same; when the first line does not, no line may. A block size the caller asked for (`given`) that differs
    from the lines' is an error, except DEFAULT_BLOCK_SIZE, which stands for "not asked" (the lines' then wins)."""

    __slots__ = ("declared", "given", "seen")

    def __init__(self, given: int | None = None) -> None:
        if given is not None and (type(given) is not int or given < 1):  # 0 was a ZeroDivisionError at line 1
            raise RadixCacheError(f"block_size must be a positive int, got {given!r}")
        self.given = given
        self.declared: int | None = None
        self.seen = False

    def read(self, fields: FieldReader) -> int | None:
        """This line's block size (its own, or the caller's when the trace gives none): fails at the line when it
        breaks the rule."""
        value = fields.record.get("block_size")
        if value is not None:
            value = fields.count("block_size")
            if value < 1:
                fields.fail(f"must be >= 1, got {value}", "block_size")
        return self.accept(value, fields.path, fields.where)

    def accept(self, value: int | None, path: str, where: str | int) -> int | None:
        """`read` for a line's valid `block_size` value (None when the line has none); `where` is the line (worded
        only on a failure)."""
        if self.seen and value == self.declared:  # every line but the first, in a sound trace
            return value if value is not None else self.given
        if not self.seen:
            self.seen, self.declared = True, value
            given = self.given
            if value is not None and given is not None and given not in (value, DEFAULT_BLOCK_SIZE):
                problem = f"the trace's lines give block_size {value}, not the {given} asked for"
                raise TraceError(path, str(where), problem, "block_size")
            return value if value is not None else given
        if value is None:
            problem = f"missing: the first line gives {self.declared}, so every line must"
        elif self.declared is None:
            problem = f"given as {value}, but the first line gives none: every line must agree"
        else:
            problem = f"{value} differs from the first line's {self.declared}: every line must agree"
        raise TraceError(path, str(where), problem, "block_size")


def declared_block_size(path: str | Path) -> int | None:
    """The `block_size` the first line of a JSONL hash trace gives, when it gives a valid one (read without a pass
    over the file; anything wrong with the line is reported where the trace is read)."""
    try:
        first = first_line(path)  # past a byte order mark, as the reader reads it
        value = orjson.loads(first)["block_size"] if first is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if type(value) is int and value >= 1 else None


def resolve_block_size(path: str | Path, given: int) -> int:
    """The block size to replay a hash trace at: the lines' own when they give one, else `given` (which must then
    agree, or be DEFAULT_BLOCK_SIZE: see BlockSizes)."""
    declared = declared_block_size(path)
    if declared is None:
        return given
    if given not in (declared, DEFAULT_BLOCK_SIZE):
        raise TraceError(str(path), "1", f"the trace's lines give block_size {declared}, not the {given} asked for")
    return declared


def iter_mooncake(path: str | Path, block_size: int | None = None) -> Iterator[HashRequest]:
    """Read a Mooncake JSONL trace. With `block_size`, or when the lines give `block_size`, also check each
    hash_ids length against input_length (see BlockSizes for which block size wins)."""
    for _, line, declared in iter_mooncake_lines(path, block_size):
        yield HashRequest(
            timestamp_ms=line.timestamp,
            input_length=line.input_length,
            output_length=line.output_length or 0,
            hash_ids=line.hash_ids,
            block_size=declared,
            output_hash_ids=line.output_hash_ids,
            session_id=line.session_id,
            finish_timestamp_ms=line.finish_timestamp,
            retain_for=line.retain_for,
        )


def iter_mooncake_lines(
    path: str | Path, block_size: int | None = None
) -> Iterator[tuple[int, MooncakeLine, int | None]]:
    """(line number, line, the trace's declared block_size) for every line of a Mooncake JSONL trace, streamed and
    checked as `iter_mooncake` checks it: decoded in C (radixcache.trace.typed_lines), and read by `_read_line`
    to word any error."""
    name = str(path)
    sizes = BlockSizes(block_size)

    def fallback(name: str, lineno: int, raw: bytes) -> MooncakeLine:
        return _read_line(name, lineno, raw, sizes)

    for lineno, line in iter_typed_lines(path, MooncakeLine, fallback):
        size = sizes.accept(line.block_size, name, lineno)  # a second time after the fallback: no change
        if size is not None and len(line.hash_ids) != -(-line.input_length // size):
            problem = check_block_size(HashRequest(line.timestamp, line.input_length, 0, line.hash_ids), size)
            raise TraceError(name, str(lineno), problem or "inconsistent with input_length", "hash_ids")
        if size is not None and line.output_hash_ids is not None:
            output = line.output_length or 0
            problem = check_output_pages(
                HashRequest(0, line.input_length, output, (), None, line.output_hash_ids), size
            )
            if problem:
                raise TraceError(name, str(lineno), problem, "output_hash_ids")
        if line.finish_timestamp is not None and line.finish_timestamp < line.timestamp:
            problem = f"{line.finish_timestamp} is earlier than the request's timestamp {line.timestamp}"
            raise TraceError(name, str(lineno), problem, "finish_timestamp")
        yield lineno, line, sizes.declared


def _read_line(name: str, lineno: int, raw: bytes, sizes: BlockSizes) -> MooncakeLine:
    """A line msgspec refused, read field by field in the reader's order: raises TraceError at the first bad field,
    or returns the line (one msgspec is stricter about than the reader)."""
    fields = FieldReader(name, str(lineno), json_line(name, lineno, raw))
    block = sizes.read(fields)
    return MooncakeLine(
        timestamp=fields.timestamp("timestamp"),
        input_length=fields.count("input_length"),
        output_length=fields.count("output_length", 0),
        hash_ids=fields.int_list("hash_ids"),
        output_hash_ids=fields.int_list("output_hash_ids", None),
        session_id=fields.text("session_id", None),
        block_size=block if fields.record.get("block_size") is not None else None,  # checked by sizes.read
        finish_timestamp=fields.timestamp("finish_timestamp", None),
        retain_for=_retain_for(fields),
    )


def _retain_for(fields: FieldReader) -> float | None:
    """The lease hint: seconds in [0, 1e9], or None (as token traces check it)."""
    value = fields.number("retain_for", None)
    if value is not None and not 0 <= value <= 1e9:
        fields.fail(f"must be a finite number of seconds in [0, 1e9], got {value!r}", "retain_for")
    return value


def hash_request_to_dict(request: HashRequest) -> dict[str, Any]:
    out: dict[str, Any] = {
        "timestamp": request.timestamp_ms,
        "input_length": request.input_length,
        "output_length": request.output_length,
        "hash_ids": list(request.hash_ids),
    }
    if request.block_size is not None:
        out["block_size"] = request.block_size
    if request.output_hash_ids is not None:
        out["output_hash_ids"] = list(request.output_hash_ids)
    if request.session_id is not None:
        out["session_id"] = request.session_id
    if request.finish_timestamp_ms is not None:
        out["finish_timestamp"] = request.finish_timestamp_ms
    if request.retain_for is not None:
        out["retain_for"] = request.retain_for
    return out


def write_mooncake(path: str | Path, requests: Iterable[HashRequest]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as handle:
        for request in requests:
            handle.write(dump_json_line(hash_request_to_dict(request)))
            n += 1
    return n
