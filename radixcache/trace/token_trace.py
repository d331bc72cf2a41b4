"""Token traces: one `TokenRequest` per record, as JSONL or as a msgpack stream. The two convert losslessly.

Record fields: `timestamp` (ms), `tokens` (list of ints), `output_length`; optional `session`, `namespace`
and `output_tokens` (the recorded output, whose length must equal output_length), and `retain_for` (the lease
hint in seconds: a finite number >= 0; traces written before it have none). Optional fields are written
only when set, and numbers keep their JSON type (int or float), so JSONL -> msgpack -> JSONL is byte-stable.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import msgpack

from radixcache.tokens import SIGN_BYTE, TOKEN_TYPECODE, as_token_array
from radixcache.trace.errors import TraceError, place
from radixcache.trace.fields import MAX_TIMESTAMP_MS, FieldReader
from radixcache.trace.jsonl import compressed, dump_json_line, json_line, open_trace, read_lines
from radixcache.trace.records import TokenRequest
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
    if request.retain_for is not None:
        out["retain_for"] = request.retain_for
    return out


def request_from_dict(record: Any, path: str, where: str) -> TokenRequest:
    """Validate one decoded record; raise TraceError naming path, where and the field. The request's `source` is
    the record's place (`path:where`)."""
    fields = FieldReader(path, where, record)
    timestamp = fields.timestamp("timestamp")
    tokens = fields.int_list("tokens")
    output_length = fields.count("output_length")
    output_tokens = fields.int_list("output_tokens", None)
    if output_tokens is not None and len(output_tokens) != output_length:
        fields.fail(f"has {len(output_tokens)} tokens but output_length is {output_length}", "output_tokens")
    retain_for = fields.number("retain_for", None)
    if retain_for is not None and not retain_for <= 1e9:
        fields.fail(f"must be a finite number of seconds <= 1e9, got {retain_for!r}", "retain_for")
    return TokenRequest(
        timestamp_ms=timestamp,
        tokens=tokens,
        output_length=output_length,
        session=fields.text("session", None),
        namespace=fields.text("namespace", None),
        output_tokens=output_tokens,
        retain_for=retain_for,
        source=place(path, where),
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
            TokenRequest(
                line.timestamp,
                line.tokens,
                line.output_length,
                line.session,
                line.namespace,
                output,
                line.retain_for,
                f"{name}:{lineno}",
            ),
        )


class TokenArrays(NamedTuple):
    """A token-trace line whose ids are int64 arrays (`iter_token_arrays`)."""

    timestamp_ms: float
    tokens: array
    output_length: int
    session: str | None
    namespace: str | None
    output_tokens: array | None
    retain_for: float | None = None


def iter_token_arrays(path: str | Path) -> Iterator[tuple[int, TokenArrays]]:
    """(line number, line) for every line of a token JSONL trace, as `iter_token_lines` reads it (the same values,
    the same errors at the same lines), with the ids as int64 arrays. The simulator's streamed reader uses it: the
    ids then cross to the replay's process as bytes (radixcache.sim.packing), and the tree takes the arrays
    as they are.

    simdjson parses a line and writes its id lists straight into int64 buffers, never making a Python int of an
    id (reading the 120,000-request chat trace: 10.5 s, against 13.9 with msgspec). It takes only a line that is plainly
    well-formed (`_plain_line`); any other line, bad or merely unusual, is read by `request_from_dict`, which
    raises the reader's TraceError or returns the line as the reader reads it.
    """
    import simdjson

    name = str(path)
    parser = simdjson.Parser()
    with open_trace(path, "rb") as handle:
        for lineno, raw in read_lines(handle, name):
            line = _plain_line(parser, raw)
            if line is None:
                if not raw.strip():
                    continue
                careful = _read_token_line(name, lineno, raw)  # raises the reader's TraceError, or reads the line
                output = careful.output_tokens
                line = TokenArrays(
                    careful.timestamp,
                    as_token_array(careful.tokens),
                    careful.output_length,
                    careful.session,
                    careful.namespace,
                    None if output is None else as_token_array(output),
                    careful.retain_for,
                )
            if line.output_tokens is not None and len(line.output_tokens) != line.output_length:
                problem = f"has {len(line.output_tokens)} tokens but output_length is {line.output_length}"
                raise TraceError(name, str(lineno), problem, "output_tokens")
            yield lineno, line


_MAX_ID = 2**63 - 1


def _plain_line(parser: Any, raw: bytes) -> TokenArrays | None:
    """The line, if it is a JSON object whose fields are exactly what TokenLine accepts (keys once each; ids in
    flat lists of ints in [0, 2**63); counts ints; names strings without brackets); else None."""
    try:
        doc = parser.parse(raw)
    except Exception:  # whatever simdjson refuses (bad JSON, a number past 64 bits) goes to the careful reader
        return None
    try:
        if not hasattr(doc, "keys"):
            return None
        keys = list(doc.keys())
        if len(set(keys)) != len(keys):
            return None  # a repeated key: which one wins is the careful reader's call
        timestamp = doc.get("timestamp")
        output_length = doc.get("output_length")
        session, namespace = doc.get("session"), doc.get("namespace")
        has_output = doc.get("output_tokens") is not None
        retain_for = doc.get("retain_for")  # checked as the careful reader does
        if not (
            (retain_for is None or (type(retain_for) in (int, float) and 0 <= retain_for <= 1e9))
            and (
                (type(timestamp) is int and 0 <= timestamp <= _MAX_ID)
                or (type(timestamp) is float and 0 <= timestamp <= MAX_TIMESTAMP_MS)
            )
            and type(output_length) is int
            and 0 <= output_length <= _MAX_ID
            and (session is None or (type(session) is str and "[" not in session))
            and (namespace is None or (type(namespace) is str and "[" not in namespace))
            # simdjson flattens nested lists into the buffer: the only brackets may be the id lists' own
            and raw.count(b"[") == 1 + has_output
        ):
            return None
        tokens = _ids(doc, "tokens")
        output = _ids(doc, "output_tokens") if has_output else None
        if tokens is None or (has_output and output is None):
            return None
        return TokenArrays(timestamp, tokens, output_length, session, namespace, output, retain_for)
    finally:
        del doc  # the parser is reused for the next line only once nothing refers to this one


def _ids(doc: Any, key: str) -> array | None:
    """doc[key] as an int64 array, if it is a list of ints in [0, 2**63)."""
    ids = array(TOKEN_TYPECODE)
    try:
        ids.frombytes(doc[key].as_buffer(of_type="i"))
    except Exception:  # not a flat list of int64s: the careful reader decides
        return None
    if not ids.tobytes()[SIGN_BYTE::8].isascii():  # a sign bit set: a negative id
        return None
    return ids


def _read_token_line(name: str, lineno: int, raw: bytes) -> TokenLine:
    """A line msgspec refused, read by `request_from_dict`: raises its TraceError, or returns the line."""
    r = request_from_dict(json_line(name, lineno, raw), name, str(lineno))
    return TokenLine(r.timestamp_ms, r.tokens, r.output_length, r.session, r.namespace, r.output_tokens, r.retain_for)


def write_token_jsonl(path: str | Path, requests: Iterable[TokenRequest]) -> int:
    """Write requests as JSONL; returns how many. Each is checked as the reader will check it (`_written`)."""
    n = 0
    with open(path, "w", encoding="utf-8") as handle:
        for request in requests:
            handle.write(dump_json_line(_written(request, path, n)))
            n += 1
    return n


def _written(request: object, path: str | Path, index: int) -> dict[str, Any]:
    """The record of `request`, once the reader's own checks pass on it: a TokenRequest built in Python with a NaN
    timestamp (written as invalid JSON), a bool or negative token or a negative output_length was written, and only
    the reader refused the file. A TraceError names the request and the field."""
    if not isinstance(request, TokenRequest):  # a HashRequest was an AttributeError ('tokens')
        raise TraceError(str(path), f"request {index}", f"expected a TokenRequest, got {type(request).__name__}")
    record = request_to_dict(request)
    request_from_dict(record, str(path), f"request {index}")
    return record


# ---------------------------------------------------------------------- msgpack


#: what msgpack's errors that carry no message mean
_MSGPACK_ERRORS = {
    msgpack.FormatError: "a byte that starts no msgpack value",
    msgpack.StackError: "values nested too deep",
}


def iter_token_msgpack(path: str | Path) -> Iterator[TokenRequest]:
    """Read a stream of msgpack maps. A stream that ends inside a record raises TraceError, never stops short."""
    name = str(path)
    with open_trace(path, "rb", text=False) as handle:
        if (problem := compressed(handle.peek(8)[:8])) is not None:
            raise TraceError(name, "record 0 (byte 0)", problem)
        read = _CountedReader(handle)  # the bytes the stream held: a pipe has no size to stat (it read as 0)
        repeated: list[Any] = []  # per map unpacked, the first key it gives twice (or None); a record's map is last
        unpacker = msgpack.Unpacker(
            read, raw=False, strict_map_key=False, object_pairs_hook=lambda pairs: _map(pairs, repeated)
        )
        index = 0
        while True:
            offset = unpacker.tell()
            repeated.clear()
            try:
                record = unpacker.unpack()
            except msgpack.OutOfData:
                break
            except TypeError as exc:  # a map's key that a dict cannot hold: an array or a map
                problem = f"invalid msgpack (a map key that cannot be one: {exc})"
                raise TraceError(name, f"record {index} (byte {offset})", problem) from None
            except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
                why = str(exc) or _MSGPACK_ERRORS.get(type(exc), type(exc).__name__)  # FormatError() says nothing
                raise TraceError(name, f"record {index} (byte {offset})", f"invalid msgpack ({why})") from None
            if not isinstance(record, dict):
                # A JSON file under a msgpack name unpacks as small ints ('{' is 123): say so, not "got int"
                json_like = offset == 0 and record in (ord("{"), ord("["))
                hint = ": this file is JSON, not msgpack (name it .jsonl, or pass --format)" if json_like else ""
                problem = f"expected a msgpack map, got {type(record).__name__}{hint}"
                raise TraceError(name, f"record {index} (byte {offset})", problem)
            if repeated[-1] is not None:  # msgpack keeps the last of a key given twice, without a word
                key = repeated[-1]
                raise TraceError(name, f"record {index} (byte {offset})", "given twice in one record", str(key))
            yield request_from_dict(record, name, f"record {index} (byte {offset})")
            index += 1
        if offset != read.count:  # the stream ended inside a record that starts at `offset`
            raise TraceError(
                name,
                f"record {index} (byte {offset})",
                f"truncated msgpack stream: the last {read.count - offset} bytes do not form a whole record",
            )


def _map(pairs: list[tuple[Any, Any]], repeated: list[Any]) -> dict[Any, Any]:
    """A msgpack map as a dict, noting in `repeated` the first key it gives twice (None when none is)."""
    record = dict(pairs)
    if len(record) == len(pairs):
        repeated.append(None)
    else:
        seen: set[Any] = set()
        repeated.append(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return record


class _CountedReader:
    """A binary file's `read`, counting the bytes it returned."""

    __slots__ = ("count", "handle")

    def __init__(self, handle: Any) -> None:
        self.handle, self.count = handle, 0

    def read(self, n: int = -1) -> bytes:
        data = self.handle.read(n)
        self.count += len(data)
        return data


def write_token_msgpack(path: str | Path, requests: Iterable[TokenRequest]) -> int:
    """Write requests as a stream of msgpack maps; returns how many."""
    packer = msgpack.Packer(use_bin_type=True)
    n = 0
    with open(path, "wb") as handle:
        for request in requests:
            record = _written(request, path, n)
            stamp = record["timestamp"]
            if type(stamp) is int and stamp >= 2**64:  # the reader takes any int; msgpack's ints stop at uint64
                problem = f"{stamp} does not fit msgpack's 64-bit integers (write it as a float, or keep JSONL)"
                raise TraceError(str(path), f"request {n}", problem, "timestamp")
            handle.write(packer.pack(record))
            n += 1
    return n
