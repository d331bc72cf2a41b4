"""A pass whose prefill chunks run only some of the decoder layers: a chunk staged over several passes.

A chunk that attends over a long cached prefix costs one pass far more than a decode step: 16 query tokens over
2,000 cached positions beside a decode took 75 ms against a 24 ms decode on this project's 2-core machine
(docs/tiers.md). Cutting it into fewer tokens a pass repeats the prefix's KV read in every pass; cutting it by
layers does not: each layer reads the prefix once, in whichever pass runs that layer. So while requests decode the
scheduler may run a chunk through layers `[first, stop)` only (model.batch.PrefillChunk.layers), keeping its rows
as they leave layer `stop - 1` (ForwardLogits.hidden) for the next pass. The K/V a layer computes for the chunk go
into the pool as that layer runs; its positions count as computed only once the last layer has run (engine.runner).

Layer by layer, the parts whose range holds the layer (the decodes: every layer) run it together, so the products
still read each weight once a pass for all of them (`staged_pass`).
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.model.batch import ForwardLogits
from radixcache.runtime.model.fused_decode import FusedDecode

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class LayeredModel(Protocol):
    """What a pass's parts read of the model (runtime.model.llama.LlamaModel)."""

    config: ModelConfig
    device: torch.device
    dtype: torch.dtype
    embed: torch.Tensor
    layers: Sized

    def check_positions(self, end: int) -> None: ...

    def rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def run_layer(
        self, i: int, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], how: LayerRun
    ) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor, prefill: bool, decode_rows: int) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class LayerRun:
    """What running a layer over some rows needs besides the rows (`LlamaModel.run_layer`): the pool and the `slots`
    their new K/V go to, their `attend` (or a FusedDecode: RoPE to attention in one native call), and how the
    products treat them (`prefill`: a pass of prefill chunks only; `decode_rows`: that many decode rows first)."""

    pool: KVPool
    slots: torch.Tensor
    attend: Attend | FusedDecode
    prefill: bool
    decode_rows: int


@dataclass(frozen=True, slots=True)
class RowPart:
    """One part of a pass's rows: the decodes, or one chunk. ids and positions `[T]`; slots: where their new K/V
    go in the pool; attend: their attention at a layer; layers: the decoder layers they run this pass; hidden:
    their rows entering `layers.start` when it is not 0 (a staged chunk's), else None (embedded from ids)."""

    ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    attend: Attend
    layers: range
    hidden: torch.Tensor | None = None


def check_layers(layers: tuple[int, int], num_layers: int, hidden: torch.Tensor | None, rows: int, width: int) -> range:
    """The range of a chunk's `layers` `(first, stop)`, refused unless `0 <= first < stop <= num_layers` and
    `hidden` is given exactly when `first > 0`, as `rows` rows of `width`."""
    first, stop = layers
    if not (0 <= first < stop <= num_layers):
        raise ValueError(f"a chunk's layers {layers} are not within 0 .. {num_layers} (first < stop)")
    if (hidden is None) != (first == 0):
        raise ValueError(f"a chunk entering layer {first} needs its hidden rows exactly when it does not start at 0")
    if hidden is not None and tuple(hidden.shape) != (rows, width):
        raise ValueError(f"a chunk of {rows} tokens entering layer {first} needs hidden rows [{rows}, {width}]")
    return range(first, stop)


def staged_pass(
    model: LayeredModel,
    pool: KVPool,
    parts: list[RowPart],
    decode_rows: int,
    prefill: bool,
    fused: FusedDecode | None = None,
) -> ForwardLogits:
    """Run `parts` (the decodes first, `decode_rows` of them, then the chunks) each through its own layers, every
    layer once over the parts that run it. Logits for the decodes and for the chunks that reach the last layer;
    the rows of the others (ForwardLogits.hidden). `fused`: the decodes' native glue (model.fused_decode), for the
    layers they run alone."""
    last = len(model.layers)
    xs = [part.hidden if part.hidden is not None else F.embedding(part.ids, model.embed) for part in parts]
    ropes = [model.rope_at(part.positions) for part in parts]
    joined: dict[tuple[int, ...], tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]] = {}  # per set of parts
    for i in range(last):
        active = [j for j, part in enumerate(parts) if i in part.layers]
        if not active:
            continue
        sizes = [xs[j].shape[0] for j in active]
        key = tuple(active)
        if key not in joined:  # the set changes only at a range's ends: its rotary rows and slots joined once
            rope = (_cat([ropes[j][0] for j in active]), _cat([ropes[j][1] for j in active]))
            joined[key] = (rope, _cat([parts[j].slots for j in active]))
        rope, slots = joined[key]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            outs, row = [], 0
            for j, n in zip(active, sizes, strict=True):  # noqa: B023 (called within this layer's run)
                outs.append(parts[j].attend(layer, q[row : row + n], k[row : row + n], v[row : row + n]))
                row += n
            return outs[0] if len(outs) == 1 else torch.cat(outs)

        x = _cat([xs[j] for j in active])
        rows = decode_rows if decode_rows and active[0] == 0 else 0
        glue = fused if fused is not None and decode_rows and active == [0] else attend  # decodes alone: native glue
        out = model.run_layer(i, x, rope, LayerRun(pool, slots, glue, prefill, rows))
        for j, part_rows in zip(active, out.split(sizes), strict=True):
            xs[j] = part_rows
    chunks = range(1 if decode_rows else 0, len(parts))
    finished = [xs[j][-1:] for j in chunks if parts[j].layers.stop == last]
    outs = ([xs[0]] if decode_rows else []) + finished
    logits = model.logits(_cat(outs), prefill=prefill, decode_rows=decode_rows) if outs else None
    hidden = tuple(None if parts[j].layers.stop == last else xs[j] for j in chunks)
    return ForwardLogits(
        logits[:decode_rows] if logits is not None and decode_rows else None,
        logits[decode_rows:] if logits is not None and finished else None,
        hidden,
    )


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)
