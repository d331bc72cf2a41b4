"""Mooncake hash-block traces are read as they are, and hash_ids are checked against input_length."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixcache.trace import HashRequest, TraceError, iter_mooncake, read_trace, write_mooncake


def test_reads_hash_requests_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]}\n'
        '{"timestamp": 5, "input_length": 512, "output_length": 2, "hash_ids": [0]}\n'
    )
    trace = read_trace(path)
    assert (trace.format, trace.kind) == ("mooncake", "hash")
    assert trace.records == [HashRequest(0, 1000, 6, (0, 1)), HashRequest(5, 512, 2, (0,))]
    write_mooncake(tmp_path / "copy.jsonl", trace.records)
    assert list(iter_mooncake(tmp_path / "copy.jsonl")) == trace.records


def test_last_block_holds_what_input_length_leaves() -> None:
    request = HashRequest(0, 1000, 1, (7, 8))
    assert [request.block_tokens(i, 512) for i in range(2)] == [512, 488]


def test_hash_ids_that_do_not_match_input_length_name_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [0]}\n'
    )
    with pytest.raises(TraceError, match=r"m\.jsonl:2: field 'hash_ids': 1 hash ids, but input_length 1000"):
        list(iter_mooncake(path, block_size=512))
    assert len(list(iter_mooncake(path))) == 2  # unchecked without a block size


def test_missing_hash_ids_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 0, "input_length": 10}\n'
    )
    with pytest.raises(TraceError, match=r"m\.jsonl:2: field 'hash_ids': missing"):
        read_trace(path, "mooncake")


@pytest.mark.parametrize("block_size", [0, -1, True, 2.5, "512"])
def test_a_block_size_that_is_no_positive_int_is_refused_before_reading(tmp_path, block_size: object) -> None:
    """Regression: load_workload and read_trace divided by a block size of 0 (ZeroDivisionError), and read -1, True
    and 2.5 as sizes (a line "needs -1024 blocks", or True taken as 1); open_source already refused them."""
    from radixcache import RadixCacheError
    from radixcache.trace import read_trace
    from radixcache.trace.workload import load_workload

    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}\n')
    for read in (load_workload, read_trace):
        with pytest.raises(RadixCacheError, match="block_size must be a positive int, got "):
            read(str(path), block_size=block_size)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"timestamp": 0, "hash_ids": [1, 2], "session_id": "cut', "Unterminated string starting at column 52"),
        ('{"timestamp": 0, "session_id": "a\tb"}', "Invalid control character at column 34"),
        ('{"timestamp": 0, "input_length": }', "Expecting value at column 34"),
    ],
)
def test_a_line_that_is_not_json_says_where_in_plain_words(tmp_path: Path, line: str, problem: str) -> None:
    """A last line cut mid-record (a copy that stopped) read "Unterminated string starting at at column 52"."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1]}\n' + line)
    with pytest.raises(TraceError) as caught:
        list(iter_mooncake(path))
    assert str(caught.value) == f"{path}:2: invalid JSON ({problem})"
    sharegpt = tmp_path / "s.json"
    sharegpt.write_text('[{"conversations": [{"from": "human", "value": "cut')
    with pytest.raises(TraceError, match=r"s\.json:1: invalid JSON \(Unterminated string starting at column 48\)"):
        read_trace(sharegpt)
