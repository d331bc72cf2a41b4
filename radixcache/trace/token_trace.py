"""Token traces: one `TokenRequest` per record, as JSONL or as a msgpack stream. The two convert losslessly.

Record fields: `timestamp` (ms), `tokens` (list of ints), `output_length`; optional `session`, `namespace`
and `output_tokens` (the recorded output, whose length must equal output_length). Optional fields are written
only when set, and numbers keep their JSON type (int or float), so JSONL -> msgpack -> JSONL is byte-stable.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgpack

from radixcache.records import TokenRequest
from radixcache.trace.errors import TraceError
from radixcache.trace.fields import FieldReader
from radixcache.trace.jsonl import dump_json_line, json_line, open_trace
from radixcache.trace.typed_lines import TokenLine, iter_typed_lines


def request_to_dict(request: TokenRequest) -> dict[str, Any]:
    """The record of a request: required fields first, optional ones only when set."""
    out: dict[str, Any] = {
        "timestamp": request.timestamp_ms,
        "tokens": list(request.tokens),
        "output_length": request.output_length,
    }
    if request.session is not None:
        out["session"] = request.session
    if request.namespace is not None:
        out["namespace"] = request.namespace
    if request.output_tokens is not None:
        out["output_tokens"] = list(request.output_tokens)
    return out


def request_from_dict(record: Any, path: str, where: str) -> TokenRequest:
    """Validate one decoded record; raise TraceError naming path, where and the field."""
    fields = FieldReader(path, where, record)
    timestamp = fields.number("timestamp")
    tokens = fields.int_list("tokens")
    output_length = fields.count("output_length")
    output_tokens = fields.int_list("output_tokens", None)
    if output_tokens is not None and len(output_tokens) != output_length:
        fields.fail(f"has {len(output_tokens)} tokens but output_length is {output_length}", "output_tokens")
    return TokenRequest(
        timestamp_ms=timestamp,
        tokens=tokens,
        output_length=output_length,
        session=fields.text("session", None),
        namespace=fields.text("namespace", None),
        output_tokens=output_tokens,
    )


# ---------------------------------------------------------------------- JSONL


def iter_token_jsonl(path: str | Path) -> Iterator[TokenRequest]:
    for _, request in iter_token_lines(path):
        yield request


def iter_token_lines(path: str | Path) -> Iterator[tuple[int, TokenRequest]]:
    """(line number, request) for every line of a token JSONL trace, streamed: decoded in C
    (radixcache.trace.typed_lines), with `request_from_dict` wording any error."""
    name = str(path)
    for lineno, line in iter_typed_lines(path, TokenLine, _read_token_line):
        output = line.output_tokens
        if output is not None and len(output) != line.output_length:
            problem = f"has {len(output)} tokens but output_length is {line.output_length}"
            raise TraceError(name, str(lineno), problem, "output_tokens")
        yield (
            lineno,
            TokenRequest(line.timestamp, line.tokens, line.output_length, line.session, line.namespace, output),
        )


def _read_token_line(name: str, lineno: int, raw: bytes) -> TokenLine:
    """A line msgspec refused, read by `request_from_dict`: raises its TraceError, or returns the line."""
    r = request_from_dict(json_line(name, lineno, raw), name, str(lineno))
    return TokenLine(r.timestamp_ms, r.tokens, r.output_length, r.session, r.namespace, r.output_tokens)


def write_token_jsonl(path: str | Path, requests: Iterable[TokenRequest]) -> int:
    """Write requests as JSONL; returns how many."""
    n = 0
    with open(path, "w", encoding="utf-8") as handle:
        for request in requests:
            handle.write(dump_json_line(request_to_dict(request)))
            n += 1
    return n


# ---------------------------------------------------------------------- msgpack


def iter_token_msgpack(path: str | Path) -> Iterator[TokenRequest]:
    """Read a stream of msgpack maps. A stream that ends inside a record raises TraceError, never stops short."""
    name = str(path)
    with open_trace(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        unpacker = msgpack.Unpacker(handle, raw=False, strict_map_key=False)
        index = 0
        while True:
            offset = unpacker.tell()
            try:
                record = unpacker.unpack()
            except msgpack.OutOfData:
                break
            except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
                raise TraceError(name, f"record {index} (byte {offset})", f"invalid msgpack ({exc})") from None
            yield request_from_dict(record, name, f"record {index} (byte {offset})")
            index += 1
        if offset != size:  # the stream ended inside a record that starts at `offset`
            raise TraceError(
                name,
                f"record {index} (byte {offset})",
                f"truncated msgpack stream: the last {size - offset} bytes do not form a whole record",
            )


def write_token_msgpack(path: str | Path, requests: Iterable[TokenRequest]) -> int:
    """Write requests as a stream of msgpack maps; returns how many."""
    packer = msgpack.Packer(use_bin_type=True)
    n = 0
    with open(path, "wb") as handle:
        for request in requests:
            handle.write(packer.pack(request_to_dict(request)))
            n += 1
    return n
