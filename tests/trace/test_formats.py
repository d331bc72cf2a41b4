"""Format detection from the extension and the first record; an explicit format wins."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from radixcache.trace import TraceError, detect_format, read_trace, write_token_jsonl, write_token_msgpack
from radixcache.trace.records import TokenRequest


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n', "mooncake"),
        ('{"timestamp": 0, "tokens": [1], "output_length": 1}\n', "token-jsonl"),
        ('{"id": "a", "conversations": []}\n', "sharegpt"),
        ('[{"id": "a", "conversations": []}]', "sharegpt"),
        ('{"id": "a", "turns": [{"user": "x"}]}\n', "conversations"),
        ('\n{"messages": [{"role": "user", "content": "x"}]}\n', "openai"),
    ],
)
def test_detects_each_format_from_its_first_record(tmp_path: Path, text: str, fmt: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    assert detect_format(path) == fmt


def test_detects_msgpack_by_extension_and_by_content(tmp_path: Path) -> None:
    write_token_msgpack(tmp_path / "t.msgpack", [TokenRequest(0, (1,), 0)])
    assert detect_format(tmp_path / "t.msgpack") == "token-msgpack"
    (tmp_path / "t.msgpack").rename(tmp_path / "t.bin")
    assert detect_format(tmp_path / "t.bin") == "token-msgpack"


def test_detects_msgpack_records_with_every_optional_field_by_content(tmp_path: Path) -> None:
    """A record with all seven fields starts with the fixmap byte 0x87, which detection missed (it knew 0x80 to
    0x86): the file read as invalid JSON unless named .msgpack."""
    request = TokenRequest(0, (1, 2), 1, session="s", namespace="n", output_tokens=(3,), retain_for=1.5)
    write_token_msgpack(tmp_path / "t.bin", [request])
    assert (tmp_path / "t.bin").read_bytes()[:1] == b"\x87"
    assert detect_format(tmp_path / "t.bin") == "token-msgpack"
    assert read_trace(tmp_path / "t.bin").records == [request]


def test_a_json_file_under_a_msgpack_name_says_so(tmp_path: Path) -> None:
    """Its first byte, `{`, unpacks as the int 123: the error was `expected a JSON object, got int`."""
    write_token_jsonl(tmp_path / "t.msgpack", [TokenRequest(0, (1,), 0)])
    with pytest.raises(TraceError, match=r"record 0 \(byte 0\): expected a msgpack map, got int: this file is JSON"):
        read_trace(tmp_path / "t.msgpack")


def test_explicit_format_overrides_detection(tmp_path: Path) -> None:
    write_token_jsonl(tmp_path / "t.jsonl", [TokenRequest(0, (1,), 0)])
    with pytest.raises(TraceError, match=r"t\.jsonl:1: field 'input_length': missing"):
        read_trace(tmp_path / "t.jsonl", "mooncake")


def test_undetectable_files_say_so(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(TraceError, match="empty file"):
        detect_format(tmp_path / "e.jsonl")
    (tmp_path / "x.jsonl").write_text('{"foo": 1}\n')
    with pytest.raises(TraceError, match=r"x\.jsonl:1: cannot detect the format"):
        detect_format(tmp_path / "x.jsonl")


@pytest.mark.parametrize("fmt", [None, "sharegpt"])
def test_a_pipe_is_not_peeked_at(fmt: str | None) -> None:
    """Detection (and ShareGPT's look for a leading '[') read a pipe's start, which the reader then lacked: a ShareGPT
    array from `<(zcat ...)` failed as "expected a JSON array", a JSONL trace as "invalid JSON (Extra data)"."""
    read, write = os.pipe()
    os.write(write, b'[{"conversations": [{"from": "human", "value": "hi"}]}]')
    os.close(write)
    try:
        with pytest.raises(TraceError, match=r"format: .*(not a regular file|must be a regular file)"):
            read_trace(f"/dev/fd/{read}", fmt)
    finally:
        os.close(read)
