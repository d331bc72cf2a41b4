"""Mooncake hash-block traces (FAST'25 release format), read as they are.

Each line: `{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}`. Each hash
id stands for one block of `block_size` tokens (512 in the Mooncake release): a request's hash ids are the chain
of its prefix blocks, and the last block holds only what input_length leaves. The simulator maps each hash id
to one cache page, so that hit tokens are counted exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixcache.trace.fields import FieldReader
from radixcache.trace.jsonl import dump_json_line, iter_json_lines

DEFAULT_BLOCK_SIZE = 512


@dataclass(frozen=True, slots=True)
class HashRequest:
    """One request of a hash-block trace. hash_ids[i] names the block of prompt tokens [i*bs, (i+1)*bs)."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def block_tokens(self, index: int, block_size: int) -> int:
        """Tokens of block `index`: block_size, except the last, which holds what input_length leaves."""
        return max(0, min(block_size, self.input_length - index * block_size))


def check_block_size(request: HashRequest, block_size: int) -> str | None:
    """Why `request` is inconsistent with `block_size`, or None when each hash id covers a non-empty block."""
    blocks = len(request.hash_ids)
    need = -(-request.input_length // block_size)
    if blocks != need:
        return (
            f"{blocks} hash ids, but input_length {request.input_length} at block size {block_size} needs {need} blocks"
        )
    return None


def iter_mooncake(path: str | Path, block_size: int | None = None) -> Iterator[HashRequest]:
    """Read a Mooncake JSONL trace. With `block_size`, also check each hash_ids length against input_length."""
    name = str(path)
    for lineno, record in iter_json_lines(path):
        fields = FieldReader(name, str(lineno), record)
        request = HashRequest(
            timestamp_ms=fields.number("timestamp"),
            input_length=fields.count("input_length"),
            output_length=fields.count("output_length", 0),
            hash_ids=fields.int_list("hash_ids"),
        )
        if block_size is not None:
            problem = check_block_size(request, block_size)
            if problem:
                fields.fail(problem, "hash_ids")
        yield request


def hash_request_to_dict(request: HashRequest) -> dict[str, Any]:
    return {
        "timestamp": request.timestamp_ms,
        "input_length": request.input_length,
        "output_length": request.output_length,
        "hash_ids": list(request.hash_ids),
    }


def write_mooncake(path: str | Path, requests: Iterable[HashRequest]) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as handle:
        for request in requests:
            handle.write(dump_json_line(hash_request_to_dict(request)))
            n += 1
    return n
