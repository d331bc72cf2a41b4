"""Trace files streamed as the simulator's requests: one request in memory at a time, read again for each replay.

`TraceSource` is what `simulate` replays when a trace is too large to hold (the in-memory `Workload` is the other):
iterating it reads the file from the start, yields `SimRequest`s in file order, and checks that timestamps never
go back (a streamed replay cannot sort; an out-of-order trace is refused at its file:line, and the in-memory path,
which sorts, still reads it). Every bad field is reported where it is found, without reading the rest of the file.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path

import orjson

from radixcache.errors import RadixCacheError
from radixcache.sim.packing import RequestPacker, unpack_requests
from radixcache.sim.read_ahead import read_ahead
from radixcache.tokens import TOKEN_TYPECODE
from radixcache.trace.errors import TraceError
from radixcache.trace.formats import FORMAT_KINDS, MOONCAKE, TOKEN_JSONL, TOKEN_MSGPACK, detect_format
from radixcache.trace.jsonl import first_line, open_trace, read_lines
from radixcache.trace.mooncake import DEFAULT_BLOCK_SIZE, iter_mooncake_lines, resolve_block_size
from radixcache.trace.token_trace import iter_token_arrays, iter_token_msgpack
from radixcache.trace.workload import SimRequest, hash_sim_request


@dataclass(frozen=True, slots=True)
class TraceSource:
    """A token or hash-block trace file, streamed. `page_size`: cache tokens per page; `block_tokens`: real tokens
    per cache block (the hash block size for a hash trace, the page size for a token trace)."""

    path: str
    format: str
    kind: str  # "token" or "hash"
    page_size: int
    block_tokens: int
    read_ahead: bool = False  # read by a second process while this one replays (radixcache.sim.read_ahead)

    def __iter__(self) -> Iterator[SimRequest]:
        if self.read_ahead:
            yield from read_ahead(replace(self, read_ahead=False), pack=RequestPacker, unpack=unpack_requests)
            return
        last = None
        for where, request in self._records():
            if last is not None and request.timestamp_ms < last:
                raise TraceError(
                    self.path,
                    where,
                    f"timestamp {request.timestamp_ms} is earlier than the previous request's {last}: a streamed "
                    "replay needs requests in arrival order (sort the trace, or replay it in memory)",
                    "timestamp",
                )
            last = request.timestamp_ms
            yield request

    def blocks_for_tokens(self, tokens: int) -> int:
        """Cache blocks that hold `tokens` real tokens (rounded down)."""
        return tokens // self.block_tokens

    def span(self) -> tuple[float, float] | None:
        """The first and last timestamps of a JSONL trace, read from its two ends (no pass over the file); None
        for msgpack, for an empty file, or when an end does not parse (the replay then reports it where it is)."""
        if self.format == TOKEN_MSGPACK:
            return None
        try:
            first = first_line(self.path)  # None for a first line longer than any the reader takes
            with open(self.path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - (1 << 20)))
                tail = handle.read().rstrip().rsplit(b"\n", 1)[-1]
            if first is None:
                return None
            t0, t1 = orjson.loads(first)["timestamp"], orjson.loads(tail)["timestamp"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not all(type(t) in (int, float) for t in (t0, t1)) or t1 < t0:
            return None
        return (t0, t1)

    def count(self) -> int:
        """Requests in the file, counted without parsing (for a progress bar): lines, or msgpack records."""
        if self.format == TOKEN_MSGPACK:
            return sum(1 for _ in iter_token_msgpack(self.path))
        n = 0
        with open_trace(self.path, "rb") as handle:
            for _, line in read_lines(handle, str(self.path)):
                n += bool(line.strip())
        return n

    def _records(self) -> Iterator[tuple[str, SimRequest]]:
        if self.format == MOONCAKE:
            block = self.block_tokens  # the lines' block_size, when they give one (open_source read it)
            for lineno, line, _ in iter_mooncake_lines(self.path, block):
                hash_ids = line.hash_ids
                if line.output_hash_ids is None:
                    # As an int64 array: the read-ahead packs it and the replays copy it as bytes, not int by int.
                    with suppress(OverflowError):  # an id int64 cannot hold stays as read: the replays say why
                        hash_ids = array(TOKEN_TYPECODE, hash_ids)
                request = hash_sim_request(
                    line.timestamp,
                    hash_ids,
                    line.input_length,
                    block,
                    line.output_hash_ids,
                    line.session_id,
                    line.output_length or 0,
                    line.finish_timestamp,
                    line.retain_for,
                )
                yield str(lineno), request
        elif self.format == TOKEN_JSONL:
            for lineno, line in iter_token_arrays(self.path):  # ids as int64 arrays, which pack as bytes
                output = line.output_tokens
                yield (
                    str(lineno),
                    SimRequest(
                        line.timestamp_ms,
                        line.tokens,
                        output if output else (),
                        len(line.tokens),
                        1,
                        line.namespace,
                        line.session,
                        retain_for=line.retain_for,
                    ),
                )
        else:
            for index, request in enumerate(iter_token_msgpack(self.path)):
                # "record N (byte B)", as the reader names a record it refuses: the byte finds it in the stream
                where = (request.source or "").removeprefix(f"{self.path}: ") or f"record {index}"
                yield where, _token_request(request)


def _token_request(r: object) -> SimRequest:
    return SimRequest(
        r.timestamp_ms,  # type: ignore[attr-defined]
        tuple(r.tokens),  # type: ignore[attr-defined]
        tuple(r.output_tokens or ()),  # type: ignore[attr-defined]
        len(r.tokens),  # type: ignore[attr-defined]
        1,
        r.namespace,  # type: ignore[attr-defined]
        r.session,  # type: ignore[attr-defined]
        retain_for=r.retain_for,  # type: ignore[attr-defined]
    )


def open_source(
    path: str | Path,
    format: str | None = None,
    *,
    page_size: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    read_ahead: bool = False,
) -> TraceSource:
    """A token or hash-block trace file as a streamed source, with the same rules as `load_workload`: token
    traces use `page_size` (default 1); a hash trace's page is one hash id of `block_size` tokens. With
    `read_ahead`, every pass over it is read by a second process while this one replays (see
    `worth_reading_ahead`)."""
    if not isinstance(read_ahead, bool):  # "no" is truthy: a reader process started, silently
        raise RadixCacheError(f"read_ahead must be True or False, got {read_ahead!r}")
    name = str(path)
    fmt = format or detect_format(path)
    kind = FORMAT_KINDS.get(fmt)
    if type(block_size) is not int or block_size < 1:
        raise RadixCacheError(f"block_size must be a positive int, got {block_size!r}")
    if kind == "token":
        p = 1 if page_size is None else page_size
        if type(p) is not int or p < 1:
            raise RadixCacheError(f"page_size must be a positive int, got {p!r}")
        return TraceSource(name, fmt, kind, p, p, read_ahead)
    if kind == "hash":
        block_size = resolve_block_size(name, block_size)  # the lines' own, when they give one
        if page_size is not None and page_size != block_size:
            raise TraceError(
                name,
                "format",
                f"a hash-block trace caches one page per hash id, so its page size is the block size "
                f"({block_size}); use --block-size, not --page-size {page_size}",
            )
        return TraceSource(name, fmt, kind, 1, block_size, read_ahead)
    if kind is None:
        raise TraceError(name, "format", f"unknown trace format {fmt!r}")
    raise TraceError(
        name,
        "format",
        f"{fmt} is a text trace: tokenise it with the runtime first (radixcache replay), "
        "or simulate a token or hash-block trace",
    )


#: files from this size on are worth a reader process (it costs a fraction of a second to start, once per pass)
READ_AHEAD_MIN_BYTES = 8 << 20


def worth_reading_ahead(source: TraceSource) -> bool:
    """Whether a reader process should read `source` beside the replay: a trace of READ_AHEAD_MIN_BYTES or more, on
    a machine with a second core for it (a sweep that already runs a replay per core should not ask). Token traces
    too: their ids cross packed (radixcache.sim.packing), so the replay's process never makes them Python ints."""
    try:
        size = os.path.getsize(source.path)
    except OSError:
        return False  # opening it reports the problem
    return size >= READ_AHEAD_MIN_BYTES and usable_cpus() >= 2


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity's (`taskset`, a container's cpuset), not the host's
    (`os.cpu_count`, which counted 64 under `taskset -c 0` and started a reader process on the one CPU); every CPU
    where the platform has no affinity. (The runtime's `radixcache.runtime.cores.usable_cores` also applies a cgroup's
    CPU quota; the library may not import the runtime.)"""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
