"""Token traces: JSONL and msgpack round-trip losslessly; bad records and truncated streams are reported."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgpack
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from radixcache.cli.main import main
from radixcache.trace import (
    HashRequest,
    TraceError,
    iter_token_jsonl,
    iter_token_msgpack,
    read_trace,
    write_token_jsonl,
    write_token_msgpack,
)
from radixcache.trace.records import TokenRequest

tokens = st.lists(st.integers(0, 2**63 - 1), max_size=20).map(tuple)
names = st.none() | st.text(max_size=8)


@st.composite
def requests(draw: st.DrawFn) -> TokenRequest:
    output = draw(st.none() | tokens)
    length = len(output) if output is not None else draw(st.integers(0, 1000))
    stamp = draw(st.integers(0, 10**12) | st.floats(0, 1e12, allow_nan=False))
    return TokenRequest(stamp, draw(tokens), length, draw(names), draw(names), output)


@given(st.lists(requests(), max_size=8))
def test_jsonl_and_msgpack_round_trip_losslessly(tmp_path_factory: pytest.TempPathFactory, trace: list) -> None:
    d = tmp_path_factory.mktemp("rt")
    write_token_jsonl(d / "a.jsonl", trace)
    assert list(iter_token_jsonl(d / "a.jsonl")) == trace
    write_token_msgpack(d / "a.msgpack", iter_token_jsonl(d / "a.jsonl"))
    assert list(iter_token_msgpack(d / "a.msgpack")) == trace
    write_token_jsonl(d / "b.jsonl", iter_token_msgpack(d / "a.msgpack"))
    assert (d / "b.jsonl").read_bytes() == (d / "a.jsonl").read_bytes()


def test_optional_fields_are_written_only_when_set(tmp_path: Path) -> None:
    write_token_jsonl(tmp_path / "t.jsonl", [TokenRequest(5, (1, 2), 3)])
    assert (tmp_path / "t.jsonl").read_text() == '{"timestamp": 5, "tokens": [1, 2], "output_length": 3}\n'


def test_truncated_msgpack_is_reported_never_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "t.msgpack"
    write_token_msgpack(path, [TokenRequest(i, (1, 2, 3), 1) for i in range(3)])
    data = path.read_bytes()
    path.write_bytes(data[:-2])
    with pytest.raises(TraceError, match=r"t\.msgpack: record 2 \(byte \d+\): truncated msgpack stream"):
        list(iter_token_msgpack(path))


def test_msgpack_record_with_a_bad_field_names_the_record_and_field(tmp_path: Path) -> None:
    path = tmp_path / "t.msgpack"
    good = {"timestamp": 0, "tokens": [1], "output_length": 0}
    path.write_bytes(msgpack.packb(good) + msgpack.packb({**good, "tokens": [1, "x"]}))
    with pytest.raises(TraceError, match=r"record 1 \(byte \d+\): field 'tokens': item 1 is 'x'"):
        list(iter_token_msgpack(path))


@pytest.mark.parametrize(("field", "value"), [("timestamp", float("inf")), ("retain_for", float("inf"))])
def test_msgpack_infinity_is_refused_like_nan(tmp_path: Path, field: str, value: float) -> None:
    """msgpack holds infinities, which JSON cannot: one must be refused at its record, not crash the simulator's
    clock or come out of `trace convert` as `Infinity`, which no JSON reader takes."""
    path = tmp_path / "t.msgpack"
    good = {"timestamp": 0, "tokens": [1], "output_length": 0}
    path.write_bytes(msgpack.packb(good) + msgpack.packb({**good, field: value}))
    with pytest.raises(TraceError, match=rf"record 1 \(byte \d+\): field '{field}': .*finite.*inf"):
        list(iter_token_msgpack(path))


@pytest.mark.parametrize(
    ("line", "field", "message"),
    [
        ('{"tokens": [1], "output_length": 1}', "timestamp", "missing"),
        ('{"timestamp": "x", "tokens": [1], "output_length": 1}', "timestamp", "expected a number"),
        ('{"timestamp": 1, "tokens": [1, -2], "output_length": 1}', "tokens", "item 1 is -2"),
        ('{"timestamp": 1, "tokens": [1], "output_length": true}', "output_length", "expected a non-negative integer"),
        ('{"timestamp": 1, "tokens": [1], "output_length": 2, "output_tokens": [5]}', "output_tokens", "has 1"),
        ('{"timestamp": 1, "tokens": [1], "output_length": 0, "session": 7}', "session", "expected a string"),
    ],
)
def test_malformed_jsonl_names_file_line_and_field(tmp_path: Path, line: str, field: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "tokens": [1], "output_length": 0}\n\n' + line + "\n")
    with pytest.raises(TraceError, match=rf"bad\.jsonl:3: field '{field}': {message}") as info:
        list(iter_token_jsonl(path))
    assert (info.value.where, info.value.field) == ("3", field)


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "tokens": [1], "output_length": 0}\n{"timestamp": \n')
    with pytest.raises(TraceError, match=r"bad\.jsonl:2: invalid JSON"):
        list(iter_token_jsonl(path))


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"nope\.jsonl"):
        read_trace(tmp_path / "nope.jsonl", "token-jsonl")


def test_a_msgpack_stream_from_a_pipe_reads_whole_and_a_truncated_one_says_so(tmp_path: Path) -> None:
    """The reader took the stream's size from fstat, 0 for a pipe: `<(cat t.msgpack) --format token-msgpack` failed as
    "truncated msgpack stream: the last -194 bytes do not form a whole record"."""
    requests = [TokenRequest(0, (1, 2, 3), 1, session="s"), TokenRequest(1, (1, 2, 4), 2)]
    write_token_msgpack(tmp_path / "t.msgpack", requests)
    data = (tmp_path / "t.msgpack").read_bytes()
    for payload, cut in ((data, 0), (data[:-2], 2)):
        read, write = os.pipe()
        os.write(write, payload)
        os.close(write)
        try:
            if not cut:
                assert list(iter_token_msgpack(f"/dev/fd/{read}")) == requests
            else:
                with pytest.raises(TraceError, match=r"truncated msgpack stream: the last [1-9][0-9]* bytes"):
                    list(iter_token_msgpack(f"/dev/fd/{read}"))
        finally:
            os.close(read)


@pytest.mark.parametrize("write", [write_token_jsonl, write_token_msgpack])
@pytest.mark.parametrize(
    ("bad", "named"),
    [
        (TokenRequest(float("nan"), (1, 2), 1), "timestamp"),  # written as NaN: invalid JSON to the reader
        (TokenRequest(1.0, (True, 2), 1), "tokens"),
        (TokenRequest(1.0, (1, -2), 1), "tokens"),
        (TokenRequest(1.0, (1, 2), -1), "output_length"),
        (HashRequest(1.0, 4, 1, (7,)), "expected a TokenRequest, got HashRequest"),  # an AttributeError ('tokens')
    ],
)
def test_a_request_the_reader_would_refuse_is_refused_by_the_writer(
    tmp_path: Path, write: Any, bad: Any, named: str
) -> None:
    """The writers wrote whatever a TokenRequest built in Python held; only reading the file back refused it."""
    path = tmp_path / "t.trace"
    with pytest.raises(TraceError, match=rf"request 1.*{named}") as info:
        write(path, [TokenRequest(0.0, (1, 2), 1), bad])
    assert info.value.where == "request 1"


def test_an_int_timestamp_past_msgpacks_integers_is_refused_by_name(tmp_path: Path) -> None:
    """The readers take an int timestamp of any size; `trace convert` of one past 2**64 - 1 to msgpack was an
    'internal error: OverflowError' from the packer. The largest uint64 still round-trips, as a float past it does."""
    source = tmp_path / "a.jsonl"
    for stamp, error in ((2**64 - 1, None), (1.8446744073709552e19, None), (2**64, "request 1: field 'timestamp'")):
        write_token_jsonl(source, [TokenRequest(0, (1, 2), 1), TokenRequest(stamp, (1, 2, 3), 1)])
        result = CliRunner().invoke(main, ["trace", "convert", str(source), str(tmp_path / "a.msgpack")])
        if error is None:
            assert result.exit_code == 0, result.output
            assert [r.timestamp_ms for r in iter_token_msgpack(tmp_path / "a.msgpack")] == [0, stamp]
        else:
            assert result.exit_code == 1 and error in result.stderr and "64-bit" in result.stderr, result.stderr
            assert "internal" not in result.stderr


@pytest.mark.parametrize(
    ("data", "why"),
    [(b"\xc1\xc1", "a byte that starts no msgpack value"), (b"\x91" * 5000, "values nested too deep")],
)
def test_a_msgpack_stream_that_is_no_msgpack_says_why(tmp_path: Path, data: bytes, why: str) -> None:
    """Regression: a stream starting with 0xc1 (a byte msgpack never uses) read 'invalid msgpack ()': msgpack's
    FormatError and StackError carry no message."""
    path = tmp_path / "t.msgpack"
    path.write_bytes(data)
    with pytest.raises(TraceError, match=rf"t\.msgpack: record 0 \(byte 0\): invalid msgpack \({why}\)$"):
        list(iter_token_msgpack(path))
