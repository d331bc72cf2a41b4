"""Traces as page-level workloads: requests over cache tokens, with the real token count of each.

The simulator replays these, and trace statistics read them; they hold no simulator state.

A token trace is simulated token by token (a cache page holds `page_size` tokens). A hash-block trace is
simulated hash id by hash id: each hash id is one cache token in a cache of page size 1, so each cache block is
one trace block, and `unit` (block_size real tokens per cache token) turns matched blocks back into real tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from radixcache.errors import RadixCacheError
from radixcache.trace.errors import TraceError
from radixcache.trace.formats import read_trace
from radixcache.trace.mooncake import (
    DEFAULT_BLOCK_SIZE,
    HashRequest,
    check_block_size,
    check_output_pages,
    resolve_block_size,
)
from radixcache.trace.records import TokenRequest


class SimRequest(NamedTuple):
    """One request to replay (a NamedTuple: a streamed trace builds one per line, at a fifth of a frozen
    dataclass's cost).

    prompt: cache tokens looked up (token ids, or hash ids). output: cache tokens inserted after the prompt
    (the recorded output, if any). Both are tuples, or int64 arrays where they were read as such (a streamed token
    trace) or crossed the read-ahead pipe (radixcache.sim.packing); an empty output is always ().
    prompt_tokens: real prompt tokens. unit: real tokens per cache token, so a match of k cache tokens hits
    `min(k * unit, prompt_tokens)` real tokens.
    """

    timestamp_ms: float
    prompt: Sequence[int]
    output: Sequence[int]
    prompt_tokens: int
    unit: int = 1
    namespace: str | None = None
    session: str | None = None
    output_tokens: int | None = None  # real tokens the request generated, when known (a hash trace's output_length)
    holds_tail: bool = False  # an engine ran it: while running it also held a page it was still writing, if any
    # When it left the engine that ran it (a recorded trace's finish_timestamp): the replay then finishes it at that
    # time, whatever its `concurrency` (radixcache.sim.inflight); None: after `concurrency` later arrivals.
    finish_ms: float | None = None
    retain_for: float | None = None  # the request's lease hint in seconds (radixcache.sim.lease_replay), if any


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests in arrival order, the cache page size (in cache tokens) and real tokens per cache block."""

    requests: tuple[SimRequest, ...]
    page_size: int
    block_tokens: int
    kind: str  # "token" or "hash"

    def __iter__(self) -> Iterator[SimRequest]:
        return iter(self.requests)

    def blocks_for_tokens(self, tokens: int) -> int:
        """Cache blocks that hold `tokens` real tokens (rounded down)."""
        return tokens // self.block_tokens

    @property
    def total_pages(self) -> int:
        """Pages every request would insert: an upper bound on the blocks an infinite cache ever holds."""
        p = self.page_size
        return sum(-(-(len(r.prompt) + len(r.output)) // p) for r in self.requests)


def _arrival_order(requests: Sequence[SimRequest]) -> tuple[SimRequest, ...]:
    """The requests sorted by timestamp (stable: ties keep file order). Raises RadixCacheError for a timestamp that
    is not a finite number (records built in Python are not checked as a trace's readers check them): NaN sorts
    nowhere, and either one failed the replay's time windows with a ValueError or an OverflowError."""
    for index, r in enumerate(requests):
        try:
            finite = not isinstance(r.timestamp_ms, bool) and math.isfinite(r.timestamp_ms)
        except TypeError:
            finite = False
        if not finite:
            raise RadixCacheError(f"request {index}: timestamp_ms must be a finite number, got {r.timestamp_ms!r}")
    return tuple(sorted(requests, key=lambda r: r.timestamp_ms))


def token_workload(requests: Iterable[TokenRequest], page_size: int = 1) -> Workload:
    """A token trace at a cache page size; each request inserts its prompt plus its recorded output."""
    if type(page_size) is not int or page_size < 1:
        raise RadixCacheError(f"page_size must be a positive int, got {page_size!r}")
    sim = [
        SimRequest(
            r.timestamp_ms,
            tuple(r.tokens),
            tuple(r.output_tokens or ()),
            len(r.tokens),
            1,
            r.namespace,
            r.session,
            retain_for=r.retain_for,
        )
        for r in _records(requests, TokenRequest, HashRequest, "hash_workload")
    ]
    return Workload(_arrival_order(sim), page_size, page_size, "token")


def _records(requests: object, kind: type, other: type, use: str) -> Iterator:
    """`requests`, each checked to be a `kind`: a list of the other kind of request (or of anything else) was an
    AttributeError naming a field (`tokens`, `block_size`), and None a TypeError."""
    if not isinstance(requests, Iterable) or isinstance(requests, (str, bytes)):
        raise RadixCacheError(f"requests must be an iterable of {kind.__name__}s, got {type(requests).__name__}")
    for index, r in enumerate(requests):
        if not isinstance(r, kind):
            hint = f" (use {use} for {other.__name__}s)" if isinstance(r, other) else ""
            raise RadixCacheError(f"request {index} must be a {kind.__name__}, got {type(r).__name__}{hint}")
        yield r


def hash_sim_request(
    timestamp_ms: float,
    hash_ids: tuple[int, ...],
    input_length: int,
    block_size: int,
    output_hash_ids: tuple[int, ...] | None = None,
    session: str | None = None,
    output_tokens: int | None = None,
    finish_ms: float | None = None,
    retain_for: float | None = None,
) -> SimRequest:
    """One hash-trace request as the simulator replays it (`output_tokens`: its output_length, a feature the
    `reuse` policy learns from).

    Without `output_hash_ids` (a Mooncake trace): the prompt's ids are looked up in full and inserted. With them (a
    trace an engine recorded), the request runs as the engine ran it: the lookup covers the prompt's whole pages (the
    engine computes the last token again, for its logits, but keeps the rest of a cached page that holds it: one
    token a full hit counts here and not there), and the pages inserted are the prompt's whole pages, then
    `output_hash_ids` (the engine's tree never holds a partial page); while it runs it also holds one block for the
    page the engine was still writing, which it frees at the end: none when the tokens it wrote (all but the last
    generated) end on a page boundary (radixcache.sim.replay_common.holds_engine_tail).
    """
    if output_hash_ids is None:
        return SimRequest(
            timestamp_ms,
            hash_ids,
            (),
            input_length,
            block_size,
            None,
            session,
            output_tokens,
            False,
            finish_ms,
            retain_for,
        )
    whole = input_length // block_size
    output = tuple(output_hash_ids)
    # While it ran, the engine also held the page it was still writing (its partial last page): holds_tail.
    looked = hash_ids[:whole]
    return SimRequest(
        timestamp_ms,
        looked,
        output,
        input_length,
        block_size,
        None,
        session,
        output_tokens,
        True,
        finish_ms,
        retain_for,
    )


def hash_workload(requests: Iterable[HashRequest], block_size: int = DEFAULT_BLOCK_SIZE) -> Workload:
    """A hash-block trace: one cache page per hash id, `block_size` real tokens per block (the requests' own
    `block_size` when they give one: all must agree, and `block_size` must agree or be DEFAULT_BLOCK_SIZE)."""
    if type(block_size) is not int or block_size < 1:
        raise RadixCacheError(f"block_size must be a positive int, got {block_size!r}")
    sim = []
    declared: int | None = None
    for index, r in enumerate(_records(requests, HashRequest, TokenRequest, "token_workload")):
        if index == 0:
            declared = r.block_size
            if declared is not None and block_size not in (declared, DEFAULT_BLOCK_SIZE):
                raise RadixCacheError(f"request 0: block_size {declared}, not the {block_size} asked for")
        elif r.block_size != declared:
            raise RadixCacheError(f"request {index}: block_size {r.block_size} differs from request 0's {declared}")
        size = block_size if declared is None else declared
        problem = check_block_size(r, size)
        if problem:
            raise RadixCacheError(f"request {index}: {problem}")
        problem = check_output_pages(r, size)
        if problem:
            raise RadixCacheError(f"request {index}: output_hash_ids: {problem}")
        sim.append(
            hash_sim_request(
                r.timestamp_ms,
                tuple(r.hash_ids),
                r.input_length,
                size,
                r.output_hash_ids,
                r.session_id,
                r.output_length,
                r.finish_timestamp_ms,
                r.retain_for,
            )
        )
    return Workload(_arrival_order(sim), 1, block_size if declared is None else declared, "hash")


def load_workload(
    path: str,
    format: str | None = None,
    *,
    page_size: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Workload:
    """Read a token or hash-block trace file as a Workload.

    Token traces use `page_size` (default 1). A hash-block trace has one cache page per hash id, so its page
    size is its block size: `page_size` may be omitted or equal `block_size`. Text traces need a tokenizer
    first, so they raise TraceError.
    """
    trace = read_trace(path, format, block_size=block_size)
    if trace.kind == "hash":
        block_size = resolve_block_size(path, block_size)  # the lines' own, when they give one
    if trace.kind == "token":
        return token_workload(trace.records, 1 if page_size is None else page_size)
    if trace.kind == "hash":
        if page_size is not None and page_size != block_size:
            raise TraceError(
                str(path),
                "format",
                f"a hash-block trace caches one page per hash id, so its page size is the block size "
                f"({block_size}); use --block-size, not --page-size {page_size}",
            )
        return hash_workload(trace.records, block_size)
    raise TraceError(
        str(path),
        "format",
        f"{trace.format} is a text trace: tokenise it with the runtime first (radixcache replay), "
        "or simulate a token or hash-block trace",
    )
