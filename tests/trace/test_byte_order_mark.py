"""A trace saved with a UTF-8 byte order mark (Notepad, PowerShell's Out-File, Excel's "CSV UTF-8" family of tools)
is read as the same file without it: JSON lets a parser ignore the mark, and every reader refused the first line
("Unexpected UTF-8 BOM"). Line numbers are unchanged; a msgpack stream is never stripped."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from radixcache.trace import TraceError, read_trace
from radixcache.trace.mooncake import resolve_block_size
from radixcache.trace.token_trace import iter_token_arrays, iter_token_lines

BOM = b"\xef\xbb\xbf"
TRACES = {
    "tokens.jsonl": [
        {"timestamp": 0, "tokens": [1, 2, 3], "output_length": 2},
        {"timestamp": 5, "tokens": [1, 2, 3, 4], "output_length": 2},
    ],
    "conversations.jsonl": [{"id": "c", "turns": [{"user": "hi"}]}],
    "openai.jsonl": [{"messages": [{"role": "user", "content": "hi"}]}],
    "mooncake.jsonl": [{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1], "block_size": 4}],
}


def _write(path: Path, text: str, bom: bool) -> Path:
    path.write_bytes((BOM if bom else b"") + text.encode())
    return path


@pytest.mark.parametrize("name", sorted(TRACES))
def test_a_jsonl_trace_with_a_byte_order_mark_reads_as_without(tmp_path: Path, name: str) -> None:
    text = "".join(json.dumps(r) + "\r\n" for r in TRACES[name])
    plain = read_trace(_write(tmp_path / f"plain-{name}", text, False))
    marked = read_trace(_write(tmp_path / name, text, True))
    assert (marked.format, marked.records) == (plain.format, plain.records)


def test_a_sharegpt_array_with_a_byte_order_mark_reads_as_without(tmp_path: Path) -> None:
    text = json.dumps([{"id": "s", "conversations": [{"from": "human", "value": "hi"}]}])
    marked = read_trace(_write(tmp_path / "s.json", text, True))
    assert marked.format == "sharegpt" and [c.id for c in marked.records] == ["s"]


def test_the_readers_keep_their_line_numbers_past_the_mark(tmp_path: Path) -> None:
    text = json.dumps(TRACES["tokens.jsonl"][0]) + "\n" + '{"timestamp": 1, "tokens": [-1], "output_length": 1}\n'
    path = _write(tmp_path / "t.jsonl", text, True)
    for reader in (iter_token_lines, iter_token_arrays):
        with pytest.raises(TraceError, match=r"t\.jsonl:2: "):
            list(reader(path))
    assert resolve_block_size(_write(tmp_path / "m.jsonl", json.dumps(TRACES["mooncake.jsonl"][0]), True), 512) == 4


def test_a_msgpack_stream_is_read_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "t.msgpack"
    path.write_bytes(BOM + msgpack.packb(TRACES["tokens.jsonl"][0]))
    with pytest.raises(TraceError, match="record 0"):
        read_trace(path)
