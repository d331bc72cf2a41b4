"""A trace line that gives a field twice is refused at its file:line, naming the field, by every reader of token and
Mooncake lines (msgspec's, simdjson's, the field-by-field one) and by the CLI: the parsers keep the last value
without a word, so `"hash_ids": [1], "hash_ids": [2, 3]` used to replay [2, 3] and drop [1]. A line whose keys
are each given once reads as before, whatever else it holds (nulls, unknown keys, strings with quotes). A msgpack
map whose key is an array or a map is refused at its record too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.cli.main import main
from radixcache.trace import TraceError
from radixcache.trace.mooncake import iter_mooncake_lines
from radixcache.trace.token_trace import iter_token_arrays, iter_token_lines
from radixcache.trace.workload import load_workload

GOOD_HASH = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
GOOD_TOKEN = {"timestamp": 0, "tokens": [1, 2, 3], "output_length": 1}
READERS = {
    "mooncake": lambda path: list(iter_mooncake_lines(path, None)),
    "token lines": lambda path: list(iter_token_lines(path)),
    "token arrays": lambda path: list(iter_token_arrays(path)),
}


def line_with(record: dict, repeated: str, value: object) -> bytes:
    """`record` as a JSON object with `repeated` given once more, with `value`, at the end (so it wins)."""
    return json.dumps(record)[:-1].encode() + f", {json.dumps(repeated)}: {json.dumps(value)}}}".encode()


def write(tmp: Path, first: dict, second: bytes) -> Path:
    path = tmp / "t.jsonl"
    path.write_bytes(json.dumps(first).encode() + b"\n" + second + b"\n")
    return path


HASH_FIELDS = st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "session_id"])
TOKEN_FIELDS = st.sampled_from(["timestamp", "tokens", "output_length", "session", "namespace"])
REPEATS = st.one_of(st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=2), st.just("s"), st.none())


@pytest.mark.parametrize("reader", list(READERS))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_field_given_twice_is_refused_at_its_line(reader: str, data: st.DataObject, tmp_path_factory) -> None:
    good = GOOD_HASH if reader == "mooncake" else GOOD_TOKEN
    field = data.draw(HASH_FIELDS if reader == "mooncake" else TOKEN_FIELDS)
    record = dict(good)
    if field not in record:  # a string field: given once with a sound value first
        record[field] = "a"
    path = write(tmp_path_factory.mktemp("t"), good, line_with(record, field, data.draw(REPEATS)))
    with pytest.raises(TraceError) as caught:
        READERS[reader](path)
    assert str(caught.value) == f"{path}:2: field {field!r}: given twice in one record"


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"other": 1},
        {"other": {"a": 1, "b": [1, 2]}},
        {"namespace": None, "output_hash_ids": None},
        {"other": 'say "hi"'},
        {"other": "x", "more": ["y", "z"]},
    ],
)
def test_keys_given_once_read_as_the_record_says(reader: str, extra: dict, tmp_path: Path) -> None:
    good = GOOD_HASH if reader == "mooncake" else GOOD_TOKEN
    record = {**good, **extra}
    if reader == "mooncake":
        record["session_id"] = 'a "quoted" name'
    path = write(tmp_path, good, json.dumps(record).encode())
    rows = READERS[reader](path)
    assert len(rows) == 2
    line = rows[1][1]
    if reader == "mooncake":
        assert (list(line.hash_ids), line.input_length, line.session_id) == ([1], 10, 'a "quoted" name')
    else:
        assert (list(line.tokens), line.output_length) == ([1, 2, 3], 1)


@pytest.mark.parametrize(
    "command", [["simulate", "--capacity-blocks", "4"], ["simulate", "--in-memory"], ["trace", "stats"]]
)
def test_the_cli_names_the_line_and_field_and_exits_1(command: list[str], tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_HASH, line_with(GOOD_HASH, "hash_ids", [2, 3]))
    argv = command[:1] + ([command[1], str(path)] if command[0] == "trace" else [str(path), *command[1:]])
    if "--in-memory" in argv:
        argv += ["--capacity-blocks", "4"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 1, result.output
    assert result.output.strip() == f"error: {path}:2: field 'hash_ids': given twice in one record"
    with pytest.raises(TraceError, match="given twice"):
        load_workload(path)


def msgpack_map(pairs: list[tuple[str, object]]) -> bytes:
    """A msgpack map of these pairs, in order, a key given twice included (msgpack.packb takes a dict)."""
    import msgpack

    assert len(pairs) < 16
    return bytes([0x80 | len(pairs)]) + b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in pairs)


@pytest.mark.parametrize("field", ["timestamp", "tokens", "output_length", "session"])
def test_a_msgpack_record_giving_a_field_twice_is_refused_at_its_record(field: str, tmp_path: Path) -> None:
    from radixcache.trace.token_trace import iter_token_msgpack

    good = list(GOOD_TOKEN.items())
    first = msgpack_map(good)
    again = {"timestamp": 5, "tokens": [7, 8], "output_length": 2, "session": "s"}[field]
    path = tmp_path / "t.msgpack"
    path.write_bytes(first + msgpack_map([*good, ("session", "a"), (field, again)]))
    with pytest.raises(TraceError) as caught:
        list(iter_token_msgpack(path))
    assert str(caught.value) == f"{path}: record 1 (byte {len(first)}): field {field!r}: given twice in one record"
    path.write_bytes(first + msgpack_map([*good, ("other", {"a": 1})]))  # each key once: read as it says
    assert [list(r.tokens) for r in iter_token_msgpack(path)] == [[1, 2, 3], [1, 2, 3]]


@pytest.mark.parametrize("key", [b"\x91\x01", b"\x81\x01\x01"], ids=["array", "map"])
def test_a_msgpack_map_key_that_is_an_array_or_map_is_a_trace_error_at_its_record(key: bytes, tmp_path: Path) -> None:
    """It was "internal error: TypeError: unhashable type" from the CLI, naming no record."""
    from radixcache.trace.token_trace import iter_token_msgpack

    first = msgpack_map(list(GOOD_TOKEN.items()))
    path = tmp_path / "t.msgpack"
    path.write_bytes(first + b"\x81" + key + b"\x01")
    with pytest.raises(TraceError, match=rf"^{path}: record 1 \(byte {len(first)}\): invalid msgpack \(a map key"):
        list(iter_token_msgpack(path))
    result = CliRunner().invoke(main, ["simulate", str(path), "--capacity-blocks", "4"])
    assert result.exit_code == 1 and result.output.startswith(f"error: {path}: record 1"), result.output
