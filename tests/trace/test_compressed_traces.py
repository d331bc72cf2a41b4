"""A compressed trace (`t.jsonl.gz`, as traces are often shipped) is refused at its first line, naming the compression
and what to do, by detection and by every reader: it was "cannot detect the format: invalid JSON (Expecting value)",
"not UTF-8 text (invalid start byte)" with --format, and "expected a msgpack map, got int" under a msgpack name."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from pathlib import Path

import msgpack
import pytest
from click.testing import CliRunner

from radixcache.cli.main import main
from radixcache.trace import FORMATS, TraceError, detect_format, read_trace

LINES = {
    "mooncake": {"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1]},
    "token-jsonl": {"timestamp": 0, "tokens": [1, 2, 3], "output_length": 2},
    "conversations": {"id": "c", "turns": [{"user": "hi"}]},
    "openai": {"messages": [{"role": "user", "content": "hi"}]},
    "sharegpt": {"id": "s", "conversations": [{"from": "human", "value": "hi"}]},
}
# zstd has no compressor in the standard library: its frame's magic number, then bytes no trace starts with
ZSTD_FRAME = b"\x28\xb5\x2f\xfd\x24\x00\x01\x00\x00\x99\xe9\xd8\x51"
COMPRESSORS = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress, "zstd": lambda _: ZSTD_FRAME}


def _plain(fmt: str) -> bytes:
    if fmt == "token-msgpack":
        return msgpack.packb(LINES["token-jsonl"])
    record = LINES[fmt]
    return (json.dumps([record]) if fmt == "sharegpt" else json.dumps(record) + "\n").encode()


@pytest.mark.parametrize("kind", sorted(COMPRESSORS))
@pytest.mark.parametrize("fmt", [None, *FORMATS])
def test_a_compressed_trace_is_refused_at_its_first_line_naming_the_compression(
    tmp_path: Path, kind: str, fmt: str | None
) -> None:
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(_plain(fmt or "mooncake"))
    assert read_trace(plain, fmt).records  # the same data, decompressed, reads
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(COMPRESSORS[kind](plain.read_bytes()))
    where = "record 0 (byte 0)" if fmt == "token-msgpack" else "1"
    sep = " " if fmt == "token-msgpack" else ""
    with pytest.raises(TraceError) as caught:
        read_trace(path, fmt)
    assert str(caught.value).startswith(f"{path}:{sep}{where}: {kind}-compressed data, not a trace: decompress it")


def test_a_gzipped_msgpack_trace_under_its_name_and_a_gzipped_file_detected_say_so(tmp_path: Path) -> None:
    path = tmp_path / "t.msgpack"
    path.write_bytes(gzip.compress(_plain("token-msgpack")))
    with pytest.raises(TraceError, match=r"t\.msgpack: record 0 \(byte 0\): gzip-compressed data"):
        read_trace(path)
    path = tmp_path / "t.jsonl"
    path.write_bytes(gzip.compress(_plain("mooncake")))
    with pytest.raises(TraceError, match=r"t\.jsonl:1: gzip-compressed data.*\(zcat FILE \| radixcache \.\.\. -\)"):
        detect_format(path)


@pytest.mark.parametrize(
    "command", ["simulate {0} --capacity-blocks 8", "trace stats {0}", "trace convert {0} {0}.jsonl"]
)
def test_the_commands_exit_non_zero_with_the_one_line_error(tmp_path: Path, command: str) -> None:
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(_plain("mooncake")))
    result = CliRunner().invoke(main, command.format(path).split())
    assert result.exit_code == 1, result.output
    assert f"{path}:1: gzip-compressed data, not a trace" in result.output
    assert "Traceback" not in result.output
