"""Trace lines decoded in C (msgspec) give exactly what the readers' own field-by-field checks give: the same
values (an int timestamp stays an int) or the same error at the same file:line, on generated lines good and bad."""

from __future__ import annotations

import json
import tempfile
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from radixcache.trace import TraceError
from radixcache.trace.jsonl import json_line
from radixcache.trace.mooncake import (
    BlockSizes,
    HashRequest,
    _read_line,
    check_block_size,
    check_output_pages,
    iter_mooncake_lines,
)
from radixcache.trace.token_trace import iter_token_arrays, iter_token_lines, request_from_dict

BOM = b"\xef\xbb\xbf"
BIG = [2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**70]
scalars = st.one_of(
    st.integers(-3, 40),
    st.sampled_from(BIG),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-5, max_value=1e20),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
id_lists = st.lists(st.one_of(st.integers(0, 50), scalars), max_size=6)
values = st.one_of(scalars, id_lists, st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))

MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids", "output_hash_ids", "session_id")
TOKEN_FIELDS = ("timestamp", "tokens", "output_length", "output_tokens", "session", "namespace")


def records(fields: tuple[str, ...], extra: dict[str, st.SearchStrategy]) -> st.SearchStrategy[bytes]:
    """A JSON line: mostly sound values for the fields (so that lines get past the first check), some not, some
    fields missing, an unknown field now and then, and lines that are not JSON objects at all."""
    sound = {
        "timestamp": st.one_of(st.integers(0, 10**6), st.floats(0, 1e6)),
        "input_length": st.integers(0, 64),
        "output_length": st.integers(0, 8),
        "hash_ids": st.lists(st.integers(0, 2**63 - 1), max_size=5),
        "output_hash_ids": st.lists(st.integers(0, 50), max_size=3),
        "tokens": st.lists(st.integers(0, 2**63 - 1), max_size=5),
        "output_tokens": st.lists(st.integers(0, 50), max_size=3),
        "session_id": st.text(max_size=3),
        "session": st.text(max_size=3),
        "namespace": st.text(max_size=3),
        **extra,
    }
    field = {name: st.one_of(sound[name], sound[name], values, st.just(...)) for name in (*fields, *extra)}
    objects = st.fixed_dictionaries(field, optional={"other": values}).map(
        lambda d: {k: v for k, v in d.items() if v is not ...}
    )
    encoded = objects.map(lambda d: json.dumps(d).encode())
    return st.one_of(
        encoded,
        encoded,
        encoded,
        values.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=8).filter(lambda b: b"\n" not in b),
    )


def outcome(read: Callable[[], Iterator]) -> tuple:
    """("ok", every value with its type) or ("error", the message)."""
    try:
        rows = list(read())
    except TraceError as exc:
        return ("error", str(exc))
    return ("ok", [[(v, type(v)) for v in row] for row in rows])


def write(line: bytes) -> Path:
    path = Path(tempfile.mkdtemp()) / "t.jsonl"
    path.write_bytes(line + b"\n")
    return path


@settings(max_examples=150, deadline=None)  # was 400 before the fast test path (issue 30)
@given(records(MOONCAKE_FIELDS, {"block_size": st.integers(1, 600)}), st.sampled_from([None, 16, 512]))
@example(line=BOM + b" ", given_size=None)  # a file that starts with a byte order mark is read without it
def test_mooncake_lines_match_the_field_by_field_reader(line: bytes, given_size: int | None) -> None:
    path = write(line)
    name = str(path)
    line = line.removeprefix(BOM)  # what the slow reader reads, as the file's reader skips the mark

    def fast() -> Iterator:
        for lineno, r, declared in iter_mooncake_lines(path, given_size):
            fields = (r.timestamp, r.input_length, r.output_length or 0, r.hash_ids, r.output_hash_ids, r.session_id)
            yield (lineno, *fields, declared)

    def slow() -> Iterator:  # the reader as it was: orjson, then FieldReader in field order, then the length
        if not line.strip():
            return
        sizes = BlockSizes(given_size)
        r = _read_line(name, 1, line + b"\n", sizes)  # as the file gives it
        size = sizes.declared if sizes.declared is not None else given_size
        problem = check_block_size(HashRequest(r.timestamp, r.input_length, 0, r.hash_ids), size) if size else None
        if problem:
            raise TraceError(name, "1", problem, "hash_ids")
        out = HashRequest(0, r.input_length, r.output_length or 0, (), None, r.output_hash_ids)
        problem = check_output_pages(out, size) if size else None
        if problem:
            raise TraceError(name, "1", problem, "output_hash_ids")
        fields = (r.timestamp, r.input_length, r.output_length or 0, r.hash_ids, r.output_hash_ids, r.session_id)
        yield (1, *fields, sizes.declared)

    assert outcome(fast) == outcome(slow)


@settings(max_examples=150, deadline=None)  # was 400 before the fast test path (issue 30)
@given(records(TOKEN_FIELDS, {}))
@example(line=BOM + b" ")
def test_token_lines_match_the_field_by_field_reader(line: bytes) -> None:
    path = write(line)
    name = str(path)
    line = line.removeprefix(BOM)

    def fast() -> Iterator:
        for lineno, r in iter_token_lines(path):
            yield (lineno, r.timestamp_ms, r.tokens, r.output_length, r.session, r.namespace, r.output_tokens)

    def slow() -> Iterator:
        if not line.strip():
            return
        r = request_from_dict(json_line(name, 1, line + b"\n"), name, "1")
        yield (1, r.timestamp_ms, r.tokens, r.output_length, r.session, r.namespace, r.output_tokens)

    assert outcome(fast) == outcome(slow)


def test_an_error_is_reported_without_reading_the_rest(tmp_path: Path) -> None:
    """Bad input names its line as soon as it is read: the lines after it are never decoded."""
    path = tmp_path / "m.jsonl"
    good = b'{"timestamp": 1, "input_length": 16, "hash_ids": [3]}\n'
    path.write_bytes(good * 3 + b'{"timestamp": 2, "input_length": 16, "hash_ids": [-1]}\n' + b"\xff garbage\n" * 5)
    lines = iter_mooncake_lines(path, 16)
    assert [lineno for lineno, _, _ in (next(lines), next(lines), next(lines))] == [1, 2, 3]
    with pytest.raises(TraceError, match=r"m\.jsonl:4: field 'hash_ids': item 0 is -1"):
        next(lines)


@st.composite
def near_sound_mooncake(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """A line consistent at its block size, with at most one field replaced by any value."""
    block = draw(st.sampled_from([16, 512]))
    ids = draw(st.lists(st.integers(0, 2**63 - 1), max_size=5))
    low = (len(ids) - 1) * block + 1 if ids else 0
    record = {
        "timestamp": draw(st.one_of(st.integers(0, 10**6), st.floats(0, 1e6))),
        "input_length": draw(st.integers(low, len(ids) * block)),
        "output_length": draw(st.integers(0, 9)),
        "hash_ids": ids,
    }
    if draw(st.booleans()):
        record["block_size"] = block
    if draw(st.booleans()):
        record["session_id"] = draw(st.text(max_size=3))
    if draw(st.booleans()):
        record["output_hash_ids"] = draw(st.lists(st.integers(0, 9), max_size=3))
    if draw(st.booleans()):
        record[draw(st.sampled_from([*MOONCAKE_FIELDS, "block_size"]))] = draw(values)
    given_size = None if "block_size" in record and draw(st.booleans()) else draw(st.sampled_from([block, 512, None]))
    return json.dumps(record).encode(), given_size


@settings(max_examples=150, deadline=None)  # was 300 before the fast test path (issue 30)
@given(near_sound_mooncake())
def test_near_sound_mooncake_lines_match_the_field_by_field_reader(case: tuple[bytes, int | None]) -> None:
    test_mooncake_lines_match_the_field_by_field_reader.hypothesis.inner_test(*case)


def arrays_outcome(path: Path) -> tuple:
    """iter_token_arrays' lines, ids as tuples, in `outcome`'s form."""

    def read() -> Iterator:
        for lineno, r in iter_token_arrays(path):
            assert type(r.tokens) is array and r.tokens.typecode == "q"
            output = None if r.output_tokens is None else tuple(r.output_tokens)
            yield (lineno, r.timestamp_ms, tuple(r.tokens), r.output_length, r.session, r.namespace, output)

    return outcome(read)


def lines_outcome(path: Path) -> tuple:
    def read() -> Iterator:
        for lineno, r in iter_token_lines(path):
            yield (lineno, r.timestamp_ms, r.tokens, r.output_length, r.session, r.namespace, r.output_tokens)

    return outcome(read)


@settings(max_examples=150, deadline=None)  # was 400 before the fast test path (issue 30)
@given(records(TOKEN_FIELDS, {}))
def test_token_arrays_match_the_token_reader(line: bytes) -> None:
    """simdjson's int64 buffers take a line only when it is plainly sound; every value and error is the reader's."""
    path = write(line)
    assert arrays_outcome(path) == lines_outcome(path)


@pytest.mark.parametrize(
    "line",
    [
        b'{"timestamp": 1, "tokens": [[1], [2]], "output_length": 0}',  # simdjson would flatten a nested list
        b'{"timestamp": 1, "tokens": [1, [2]], "output_length": 0}',
        b'{"timestamp": 1, "tokens": [1, 2], "output_length": 1, "output_tokens": [[3]]}',
        b'{"timestamp": 1, "tokens": [1, [2]], "output_length": 0, "session": "\\u005b"}',  # a bracket hidden
        b'{"timestamp": 1, "tokens": [1, 2], "output_length": 0, "session": "a[b"}',
        b'{"timestamp": 1, "tokens": [1, 2], "tokens": [3], "output_length": 0}',  # a key twice
        b'{"timestamp": 1, "tokens": [1, -2], "output_length": 0}',
        b'{"timestamp": 1, "tokens": [1, 9223372036854775808], "output_length": 0}',
        b'{"timestamp": 1, "tokens": [1, 2.0], "output_length": 0}',
        b'{"timestamp": 1, "tokens": [1, true], "output_length": 0}',
        b'{"timestamp": true, "tokens": [1], "output_length": 0}',
        b'{"timestamp": -1, "tokens": [1], "output_length": 0}',
        b'{"timestamp": 1, "tokens": [1], "output_length": 1.0}',
        b'{"timestamp": 1, "tokens": [1], "output_length": 2, "output_tokens": [5]}',
        b'{"timestamp": 1, "tokens": [1], "output_length": 0, "output_tokens": null, "extra": {"a": 1}}',
        b'{"timestamp": 1, "tokens": [1], "output_length": 0, "extra": [1]}',
        b'{"timestamp": 1, "tokens": [], "output_length": 0} trailing',
        b'{"timestamp": 1.5, "tokens": [], "output_length": 0, "namespace": null}',
        b"[1, 2]",
        b"",
    ],
)
def test_token_arrays_on_lines_that_trip_a_fast_parser(line: bytes) -> None:
    path = write(line)
    assert arrays_outcome(path) == lines_outcome(path)


def test_token_arrays_read_a_whole_file_with_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    good = b'{"timestamp": 1, "tokens": [5, 6, 70000], "output_length": 1, "output_tokens": [3]}\n'
    path.write_bytes(good + b"\n  \n" + good + b'{"timestamp": 2, "tokens": [1, "x"], "output_length": 0}\n' + good)
    rows = iter_token_arrays(path)
    assert [(n, tuple(r.tokens)) for n, r in (next(rows), next(rows))] == [(1, (5, 6, 70000)), (4, (5, 6, 70000))]
    with pytest.raises(TraceError, match=r"t\.jsonl:5: field 'tokens'"):
        next(rows)


@pytest.mark.parametrize(
    "line",
    [
        b'{"timestamp": 1, "input_length": 1024, "output_length": 2, "hash_ids": [1, 2], "note": "\xff"}',
        b'{"timestamp": 1, "input_length": 1024, "output_length": 2, "hash_ids": [1, 2], "n": ["a\xe9b"]}',
    ],
)
def test_a_line_that_is_not_utf8_anywhere_is_refused_by_both_mooncake_readers(line: bytes) -> None:
    """Regression: msgspec skips an unknown field's value unread, so a Mooncake line whose unknown field held bytes
    that are not UTF-8 was taken by the fast path (trace stats, simulate), where the field-by-field reader refuses
    the line: 'not UTF-8 text'."""
    path = write(line)
    with pytest.raises(TraceError, match=r"t\.jsonl:1: not UTF-8 text"):
        list(iter_mooncake_lines(path, 512))
    with pytest.raises(TraceError, match=r"t\.jsonl:1: not UTF-8 text"):
        json_line(str(path), 1, line)


def test_a_token_line_that_is_not_utf8_is_refused_as_the_streamed_reader_refuses_it() -> None:
    """Regression: `trace stats` (msgspec) took a token line whose unknown field held a byte that is not UTF-8, and
    `simulate` (simdjson, streamed) refused the same file."""
    path = write(b'{"timestamp": 1, "tokens": [1, 2], "output_length": 2, "zz": "\xff"}')
    assert lines_outcome(path) == arrays_outcome(path)
    with pytest.raises(TraceError, match=r"t\.jsonl:1: not UTF-8 text"):
        list(iter_token_lines(path))
