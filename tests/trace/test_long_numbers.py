"""Numbers past what orjson reads exactly: an integer of 2**64 or more (orjson reads it as a float, so it was refused
as "expected a non-negative integer, got 1e+20"), and a number past a 64-bit float ("1e400", refused as just
"invalid JSON"). Each is now named for what it is, at file:line."""

from __future__ import annotations

import re

import pytest

from radixcache.trace import TraceError, read_trace


def _mooncake(tmp_path, output_length: str):
    path = tmp_path / "t.jsonl"
    good = '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}\n'
    bad = f'{{"timestamp": 1, "input_length": 4, "output_length": {output_length}, "hash_ids": [2]}}\n'
    path.write_text(good + bad)
    return path


@pytest.mark.parametrize(
    ("literal", "message"),
    [
        ("100000000000000000000", "field 'output_length': 100000000000000000000 is too large (at most 2**63 - 1)"),
        ("18446744073709551616", "field 'output_length': 18446744073709551616 is too large"),  # 2**64
        ("9223372036854775808", "field 'output_length': 9223372036854775808 is too large"),  # 2**63 (orjson: an int)
        ("1e400", "invalid JSON (the number 1e400 is too large: past a 64-bit float)"),
        ("-1e400", "invalid JSON (the number -1e400 is too large: past a 64-bit float)"),
        ("1" + "0" * 400, "invalid JSON (an integer of 401 digits (100000000000...) is too large"),
        ("1" + "0" * 5000, "invalid JSON (an integer of 5001 digits"),
        ("NaN", "invalid JSON (NaN is not a JSON number)"),
    ],
    ids=["1e20-int", "2**64", "2**63", "1e400", "-1e400", "401-digits", "5001-digits", "NaN"],
)
def test_a_number_too_large_is_named_at_its_line(tmp_path, literal, message):
    path = _mooncake(tmp_path, literal)
    with pytest.raises(TraceError, match=re.escape(f"{path}:2: {message}")):
        read_trace(path, "mooncake")


def test_a_long_hash_id_reads_exactly(tmp_path):
    """2**64 - 1 (which orjson reads exactly) and 2**64 (which it read as the float 1.8446744073709552e+19) in
    hash_ids: both are refused, each with its own value."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [3, 18446744073709551616]}\n')
    with pytest.raises(
        TraceError, match=re.escape("item 1 is 18446744073709551616, expected an integer in [0, 2**63)")
    ):
        read_trace(path, "mooncake")
    path.write_text('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [9223372036854775807]}\n')
    assert read_trace(path, "mooncake").records[0].hash_ids == (2**63 - 1,)
