"""What one forward pass computes: the running decodes and the prefill chunks of several requests, side by side.

The rows of a pass are laid out as `[decode rows | chunk 0 | chunk 1 | ...]`. Every matrix product, norm and MLP runs
once over all rows (that is where batching pays: the weights are read once per pass, not once per request);
attention runs per part, because each part attends over its own sequence's KV (`model.llama.LlamaModel.forward`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from radixcache.runtime.kv.mirror import MirrorStep
from radixcache.runtime.model.attention import DecodeMeta


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """One sequence's next prompt positions: `token_ids` at positions `start ..`, attending over the KV of
    positions `< start` already in the pages of `block_table` (which must cover the chunk's last position).

    `layers`: the decoder layers `(first, stop)` this pass runs for the chunk (None: all of them); a chunk staged
    over several passes (model.staged) enters layer `first > 0` with `hidden`, its rows `[n, hidden_size]` as the
    previous pass left them after layer `first - 1`."""

    token_ids: Sequence[int]
    start: int
    block_table: Sequence[int]
    layers: tuple[int, int] | None = None
    hidden: torch.Tensor | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """One new token per running sequence (token i at position `meta.lengths[i] - 1`). With `mirror` (a step
    prepared by kv.mirror for the same sequences and lengths) attention reads the mirror's rows, not the pages.
    `team`: the threads the native layers run this pass on where they take it without barriers
    (runtime/native/decode_team.c); 0: the calling thread's torch count, which governs the pass's other kernels."""

    token_ids: Sequence[int]
    meta: DecodeMeta
    mirror: MirrorStep | None = None
    team: int = 0


class ForwardLogits(NamedTuple):
    """decode: `[B, vocab]` float32, one row per decode (None without decodes). chunks: `[C, vocab]`, the logits
    of the last position of each chunk that ran through the last layer, in the order the chunks were given (None
    without such chunks). hidden: one entry per chunk given, its rows after its last layer where it stopped before
    the model's last layer (a staged chunk: model.staged), else None; empty when no chunk was staged. decode_best:
    where the head ran natively (model.native_layers `head`), each decode row's greedy token as
    runtime.engine.output.greedy_tokens would pick it from `decode` (None for a row whose maximum is not finite);
    else None."""

    decode: torch.Tensor | None
    chunks: torch.Tensor | None
    hidden: tuple[torch.Tensor | None, ...] = ()
    decode_best: tuple[int | None, ...] | None = None
