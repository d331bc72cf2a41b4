"""Summary statistics of a trace: sizes, sessions, and its reuse structure (what an infinite cache would hit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from radixcache.trace.formats import Trace
from radixcache.trace.mooncake import DEFAULT_BLOCK_SIZE
from radixcache.trace.workload import Workload, hash_workload, token_workload


@dataclass(frozen=True, slots=True)
class TraceStats:
    """Token and hash-block traces fill every field; text traces only the conversation counts.

    unique_blocks / block_refs: distinct prefix blocks, and prompt block references. reused_refs: references
    to a block some earlier request inserted (an infinite cache's block hits, prefix semantics).
    infinite_hit_rate: the same in prompt tokens. requests_with_hit: requests that reuse at least one block.
    """

    format: str
    kind: str
    requests: int
    prompt_tokens: int = 0
    max_prompt_tokens: int = 0
    output_tokens: int = 0
    sessions: int = 0
    namespaces: int = 0
    duration_ms: float = 0.0
    block_tokens: int = 0
    unique_blocks: int = 0
    block_refs: int = 0
    reused_refs: int = 0
    infinite_hit_rate: float = 0.0
    requests_with_hit: int = 0
    turns: int = 0
    text_chars: int = 0

    @property
    def block_reuse_rate(self) -> float:
        return self.reused_refs / self.block_refs if self.block_refs else 0.0

    def as_dict(self) -> dict:
        out = {name: getattr(self, name) for name in self.__slots__}
        out["block_reuse_rate"] = self.block_reuse_rate
        return out


def trace_stats(trace: Trace, *, page_size: int = 16, block_size: int = DEFAULT_BLOCK_SIZE) -> TraceStats:
    """Statistics of a whole trace; token traces are cut into pages of `page_size` to count block reuse."""
    records = trace.records
    if trace.kind == "text":
        return TraceStats(
            trace.format,
            trace.kind,
            requests=sum(len(c.turns) for c in records),
            sessions=len(records),
            turns=sum(len(c.turns) for c in records),
            text_chars=sum(
                len(c.system or "") + sum(len(t.user) + len(t.assistant or "") for t in c.turns) for c in records
            ),
        )
    if trace.kind == "hash":
        workload = hash_workload(records, block_size)
        outputs = sum(r.output_length for r in records)
    else:
        workload = token_workload(records, page_size)
        outputs = sum(r.output_length for r in records)
    refs, unique, reused, hit_tokens, with_hit = reuse_summary(workload)
    requests = workload.requests
    stamps = [r.timestamp_ms for r in requests]
    return TraceStats(
        trace.format,
        trace.kind,
        requests=len(requests),
        prompt_tokens=sum(r.prompt_tokens for r in requests),
        max_prompt_tokens=max((r.prompt_tokens for r in requests), default=0),
        output_tokens=outputs,
        sessions=len({r.session for r in requests if r.session is not None}),
        namespaces=len({r.namespace for r in requests}),
        duration_ms=(max(stamps) - min(stamps)) if stamps else 0.0,
        block_tokens=workload.block_tokens,
        unique_blocks=unique,
        block_refs=refs,
        reused_refs=reused,
        infinite_hit_rate=hit_tokens / max(1, sum(r.prompt_tokens for r in requests)),
        requests_with_hit=with_hit,
    )


class Reuse(NamedTuple):
    """Prefix reuse of a workload, as an infinite cache replaying it in order sees it."""

    block_refs: int  # prompt blocks (pages) referenced
    unique_blocks: int  # distinct prefix blocks inserted (prompts and recorded outputs)
    reused_refs: int  # prompt block references some earlier request inserted
    hit_tokens: int  # those references in real tokens
    requests_with_hit: int


def reuse_summary(workload: Workload) -> Reuse:
    """Count prefix reuse with a trie over pages, without a cache: what an infinite cache would hit."""
    p = workload.page_size
    trie: dict[tuple, int] = {}
    roots: dict[object, int] = {}
    refs = reused = hit_tokens = with_hit = 0
    for request in workload.requests:
        parent = roots.setdefault(request.namespace, -1 - len(roots))
        refs += -(-len(request.prompt) // p)
        # Only the prompt's whole pages can hit, as in the cache (which matches the prompt alone): its partial last
        # page may equal a page of `full` by its own output, which no cache knows at prompt time.
        prompt_pages = len(request.prompt) // p
        full = request.prompt + request.output
        matched = 0
        still_matching = True
        for k in range(len(full) // p):
            key = (parent, full[k]) if p == 1 else (parent, full[k * p : (k + 1) * p])
            lid = trie.get(key)
            if lid is None:
                still_matching = False
                lid = trie[key] = len(trie)
            elif still_matching and k < prompt_pages:
                matched += 1
            parent = lid
        reused += matched
        hit_tokens += min(matched * p * request.unit, request.prompt_tokens)
        with_hit += matched > 0
    return Reuse(refs, len(trie), reused, hit_tokens, with_hit)
