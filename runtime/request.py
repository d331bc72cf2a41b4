"""A request in flight (mutable, owned by the engine) and the frozen result handed back to the caller."""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum

import torch

from radixcache import TreeNode
from runtime.sampling import Sampler, SamplingParams


class Status(Enum):
    WAITING = "waiting"  # not yet admitted: holds no blocks
    RUNNING = "running"  # admitted: holds a lock and blocks
    FINISHED = "finished"  # released: its KV went to the tree (or was freed)
    ABORTED = "aborted"  # released after an error


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """What one request produced and what it cost.

    token_ids: generated ids (a final stop/EOS token included). text: their decoded text, without that stop
    token, cut before a stop string, special tokens skipped ("" without a tokenizer).
    cached_tokens: prompt tokens whose KV came from the cache. prefill_tokens: prompt tokens computed.
    ttft_s: request start to first token. latency_s: request start to the end.
    finish_reason: "stop" (EOS, stop token or stop string) or "length" (max_new_tokens or max_position).
    logits: `[len(token_ids), vocab]` float32 logits each token was chosen from, when asked for (tests).
    """

    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    cached_tokens: int
    prefill_tokens: int
    ttft_s: float
    latency_s: float
    finish_reason: str
    logits: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def decode_tps(self) -> float:
        """Generated tokens per second after the first."""
        n = len(self.token_ids) - 1
        return n / (self.latency_s - self.ttft_s) if n > 0 and self.latency_s > self.ttft_s else 0.0


_request_ids = itertools.count()


@dataclass(eq=False)
class Request:
    """One sequence's state from admission to release.

    Block table: `block_table[j]` holds positions `[j * P, (j + 1) * P)`. Its first `tree_blocks` entries
    belong to the radix tree (the locked match); the rest are held by this request until release.
    `num_kv` counts the leading positions of `prompt_ids + output_ids` whose K/V are in those pages; the
    last generated token's K/V is never computed, so `num_kv <= len(all_ids) - 1` once decoding starts.
    """

    prompt_ids: list[int]
    params: SamplingParams
    sampler: Sampler
    namespace: Hashable = None
    keep_logits: bool = False
    rid: int = field(default_factory=lambda: next(_request_ids))
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    tree_blocks: int = 0
    match_node: TreeNode | None = None
    cached_tokens: int = 0
    num_kv: int = 0
    finish_reason: str | None = None
    stop_at: int | None = None  # cut the text here (a stop string was found)
    logits: list[torch.Tensor] = field(default_factory=list)
    t_arrival: float = field(default_factory=time.perf_counter)
    t_first_token: float | None = None
    t_finish: float | None = None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def held_blocks(self) -> list[int]:
        """Blocks this request holds (allocated, not yet inserted or freed)."""
        return self.block_table[self.tree_blocks :]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefill_tokens(self) -> int:
        return len(self.prompt_ids) - self.cached_tokens
