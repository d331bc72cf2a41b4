"""Line-oriented JSON reading shared by the readers: each record comes with its 1-based line number."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from radixcache.trace.errors import TraceError

# orjson reads an integer outside [-2**63, 2**64) as a float (100000000000000000000 as 1e+20), which a reader then
# refused as "not an integer, got 1e+20": a line with a run of digits that long is decoded again, exactly.
_LONG_INTEGER = re.compile(rb"\d{20}|-\d{19}")
_MAX_DIGITS = 4000  # below int()'s limit of 4300 digits; an integer past a 64-bit float orjson refuses ("infinity")


#: the longest line a JSONL reader takes, in bytes: a prompt of about 30 million tokens. A longer one is refused at its
#: file:line once this much of it is read, not read whole first (a 1 GB line took 3 GB and minutes to refuse).
MAX_LINE_BYTES = 1 << 28


def read_lines(handle: IO[bytes], name: str) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for every line of a binary `handle`, each at most MAX_LINE_BYTES (its newline aside);
    TraceError at `name`:line for a longer one, having read no more of it than that."""
    limit = MAX_LINE_BYTES
    lineno = 0
    while True:
        line = handle.readline(limit + 1)
        if not line:
            return
        lineno += 1
        if len(line) > limit and not line.endswith(b"\n"):
            raise TraceError(name, str(lineno), f"a line longer than {limit:,} bytes: no trace record is that long")
        yield lineno, line


def first_line(path: str | Path) -> bytes | None:
    """The first non-blank line of a JSONL file (past a byte order mark), or None when there is none or it is
    longer than MAX_LINE_BYTES (the reader then says so at its line): for a peek at the first record."""
    try:
        with open_trace(path, "rb") as handle:
            return next((line for _, line in read_lines(handle, str(path)) if line.strip()), None)
    except TraceError:
        return None


def iter_json_lines(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, decoded value) for every non-blank line of a JSONL file, streamed: one line in memory at a
    time, parsed by orjson (the standard library's parser only to word an error the same way)."""
    name = str(path)
    with open_trace(path, "rb") as handle:
        for lineno, line in read_lines(handle, name):
            try:
                yield lineno, _decoded(line)
            except orjson.JSONDecodeError:
                if not line.strip():
                    continue
                raise _line_error(name, lineno, line) from None


def json_line(name: str, lineno: int, line: bytes) -> Any:
    """One non-blank JSONL line decoded, or TraceError at name:lineno worded as `iter_json_lines` words it; a record
    that gives a field twice is refused too, naming it (a parser keeps one of the two silently)."""
    try:
        value = _decoded(line)
    except orjson.JSONDecodeError:
        raise _line_error(name, lineno, line) from None
    if isinstance(value, dict) and (key := repeated_key(line)) is not None:
        raise TraceError(name, str(lineno), "given twice in one record", key)
    return value


def repeated_key(line: bytes) -> str | None:
    """The first key that the JSON object `line` (valid JSON) gives twice at its top level, else None."""
    found: list[str | None] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        first = None
        for key, _ in items:
            if key in seen:
                first = key
                break
            seen.add(key)
        found.append(first)  # the top-level object is the last one closed
        return {}  # the values are not needed

    json.loads(line, object_pairs_hook=pairs)
    return found[-1] if found else None


def _decoded(line: bytes) -> Any:
    """One line decoded by orjson, its integers exact (orjson's float for a long one: see _LONG_INTEGER)."""
    value = orjson.loads(line)
    if _LONG_INTEGER.search(line) is not None:
        value = json.loads(line)  # the same JSON (orjson took it), each integer an int
    return value


def _line_error(name: str, lineno: int, line: bytes) -> TraceError:
    if lineno == 1 and (problem := compressed(line)) is not None:
        return TraceError(name, str(lineno), problem)
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return TraceError(name, str(lineno), f"not UTF-8 text ({exc.reason})")
    problems: list[str] = []  # what the standard library takes and orjson refuses: numbers past a float, NaN
    try:
        value = json.loads(
            text,
            parse_float=lambda s: _float(s, problems),
            parse_int=lambda s: _int(s, problems),
            parse_constant=lambda s: problems.append(f"{s} is not a JSON number"),
        )
    except json.JSONDecodeError as exc:
        return TraceError(name, str(lineno), f"invalid JSON ({_at_column(exc)})")
    if problems:
        return TraceError(name, str(lineno), f"invalid JSON ({problems[0]})")
    # orjson is stricter: a number out of range, or a string escape that is half a surrogate pair (not Unicode)
    bad = next((c for c in _strings(value) if lone_surrogate(c) is not None), None)
    if bad is not None:
        return TraceError(name, str(lineno), f"invalid JSON (a string holds a lone surrogate {lone_surrogate(bad)!r})")
    return TraceError(name, str(lineno), "invalid JSON")


def _at_column(exc: json.JSONDecodeError) -> str:
    """The parser's message and where: some of its messages end with "at" ("Unterminated string starting at",
    "Invalid control character at"), which read "... starting at at column 19"."""
    return f"{exc.msg} column {exc.colno}" if exc.msg.endswith(" at") else f"{exc.msg} at column {exc.colno}"


def _float(literal: str, problems: list[str]) -> float:
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        problems.append(f"the number {literal} is too large: past a 64-bit float")
    return value


def _int(literal: str, problems: list[str]) -> int:
    digits = len(literal.lstrip("-"))
    if digits <= _MAX_DIGITS:  # int() of more digits raises ValueError
        value = int(literal)
        try:
            float(value)
            return value
        except OverflowError:
            pass
    problems.append(f"an integer of {digits} digits ({literal[:12]}...) is too large: past a 64-bit float")
    return 0


def lone_surrogate(text: str) -> str | None:
    """The first lone surrogate of `text` ("\\ud83d" in JSON, half an emoji), which is not Unicode text; else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


def _strings(value: Any) -> Iterator[str]:
    """Every string in a decoded JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)


def iter_json_array(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number where it starts, decoded value) for every element of a file holding one JSON array."""
    name = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise TraceError(name, "open", exc.strerror or str(exc)) from None
    if (problem := compressed(raw[:8])) is not None:
        raise TraceError(name, "1", problem)
    try:
        text = raw.decode("utf-8-sig")  # a leading byte order mark skipped, as open_trace does
    except UnicodeDecodeError as exc:
        line = str(raw.count(b"\n", 0, exc.start) + 1)
        raise TraceError(name, line, f"not UTF-8 text ({exc.reason})") from None
    decoder = json.JSONDecoder()
    pos = _skip_space(text, 0)
    if pos >= len(text) or text[pos] != "[":
        raise TraceError(name, str(_line_of(text, pos)), "expected a JSON array")
    pos = _skip_space(text, pos + 1)
    if pos < len(text) and text[pos] == "]":
        return
    line, line_pos = 1, 0
    while True:
        line += text.count("\n", line_pos, pos)
        line_pos = pos
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise TraceError(name, str(exc.lineno), f"invalid JSON ({_at_column(exc)})") from None
        yield line, value
        pos = _skip_space(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_space(text, pos + 1)
        elif pos < len(text) and text[pos] == "]":
            if _skip_space(text, pos + 1) < len(text):
                raise TraceError(name, str(_line_of(text, pos + 1)), "unexpected data after the JSON array")
            return
        else:
            raise TraceError(name, str(_line_of(text, pos)), "expected ',' or ']' in the JSON array")


BOM = b"\xef\xbb\xbf"  # the UTF-8 byte order mark some editors and Windows tools start a text file with

#: the magic bytes of the compressed files traces are shipped in, with the tool that decompresses each to stdout
_COMPRESSED = (
    (b"\x1f\x8b", "gzip", "zcat"),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstdcat"),
    (b"\xfd7zXZ\x00", "xz", "xzcat"),
    (b"BZh", "bzip2", "bzcat"),
)


def compressed(head: bytes) -> str | None:
    """What to tell of a file whose first bytes are `head` when they start a compressed file (no trace, JSON or
    msgpack, starts so), else None. Read as it is, a gzip'd trace was "invalid JSON (Expecting value)" or "not UTF-8
    text", and a gzip'd msgpack stream "expected a msgpack map, got int"."""
    for magic, kind, tool in _COMPRESSED:
        if head.startswith(magic):
            problem = "compressed data, not a trace: decompress it first, or pipe it"
            return f"{kind}-{problem} ({tool} FILE | radixcache ... -)"
    return None


def open_trace(path: str | Path, mode: str, *, text: bool = True) -> IO[Any]:
    """Open a trace file for reading ("r" text, "rb" bytes); a missing file raises TraceError. A text file's leading
    UTF-8 byte order mark is skipped (JSON allows a parser to ignore it; every line was refused); `text=False` for a
    binary stream, which is read as it is."""
    try:
        if mode == "rb":
            handle = open(path, "rb")  # noqa: SIM115 (returned: the caller's `with` closes it)
            if text and handle.peek(len(BOM))[: len(BOM)] == BOM:
                handle.read(len(BOM))
            return handle
        return open(path, encoding="utf-8-sig" if text else "utf-8")
    except OSError as exc:
        raise TraceError(str(path), "open", exc.strerror or str(exc)) from None


def dump_json_line(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": ")) + "\n"


def _skip_space(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1
