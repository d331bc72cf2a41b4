"""A decode pass's per-layer glue in one native call: RoPE of q and k, and the new K/V stored in the pool and in
the decode mirror (runtime/native/decode_store.c), then the mirror's attention.

The eager layer does the same as about ten ATen calls (RoPE's five, a dense copy of q, the pool's two index_copy_,
the mirror's two copies): 37 us a layer at batch 1 on this project's 2-core machine, about 1.1 ms of a 10 ms
SmolLM2 gguf step, for 2.3 KB of data. The native pass computes the same bits (the RoPE expression is rounded as
PyTorch rounds it: tests/runtime/engine/test_fused_decode.py).

It serves passes of decodes only (a chunk's rows go through the eager path) whose attention runs over the mirror,
with float32 on the CPU where the native library is loaded; `FusedDecode.build` returns None for anything else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.model.batch import DecodeBatch

if TYPE_CHECKING:
    from radixcache.runtime.kv.mirror import MirrorStep
    from radixcache.runtime.native.ops import NativeDecodeOps


class RotaryModel(Protocol):
    """What `build` reads of the model (runtime.model.llama.LlamaModel)."""

    native: NativeDecodeOps | None
    config: ModelConfig
    cos: torch.Tensor  # [max_position, head_dim]
    signed_sin: torch.Tensor  # sin with rotate-half's minus folded into its first half


class FusedDecode:
    """`self(layer, qkv)`: the layer's attention output `[B, H, D]` for a decode pass (the module docstring)."""

    def __init__(
        self,
        native: NativeDecodeOps,
        pool: KVPool,
        mirror: MirrorStep,
        heads: int,
        positions: torch.Tensor,
        slots: torch.Tensor,
        tables: tuple[torch.Tensor, torch.Tensor],
        team: int = 0,
    ) -> None:
        self.native = native
        self.team = team  # DecodeBatch.team: the native layers' seats where they run the pass without barriers
        self.pool = pool
        self.mirror = mirror
        self.heads = heads
        self.positions = positions
        self.slots = slots
        self.tables = tables
        self.mirror_at = (mirror.rows_t.contiguous(), mirror.positions_t.contiguous())
        # the model's (final norm, eps, head), where the native layers may run the head in their call, and what
        # that gave: (logits, each row's greedy token) (model.native_layers `run`)
        self.head_request: tuple[torch.Tensor, float, object] | None = None
        self.head_result: tuple[torch.Tensor, tuple[int | None, ...]] | None = None

    @classmethod
    def build(cls, model: RotaryModel, pool: KVPool, decode: DecodeBatch | None, chunks: int) -> FusedDecode | None:
        """The fused glue for this pass of `model`, or None where the eager layer must run (chunks in the pass, no
        mirror, no native library, another dtype or device, or a layout the kernel does not address)."""
        native = model.native
        if native is None or decode is None or chunks or decode.mirror is None:
            return None
        mirror = decode.mirror
        tables = (model.cos, model.signed_sin)
        dense = (*tables, pool.kv, *mirror.k[:1], *mirror.v[:1])
        if not all(t.is_cpu and t.dtype == torch.float32 and t.is_contiguous() for t in dense):
            return None
        meta = decode.meta  # positions and slots: int64 and dense (model.attention.build_decode_meta)
        return cls(native, pool, mirror, model.config.num_heads, meta.positions_t, meta.slots, tables, decode.team)

    def __call__(self, layer: int, qkv: torch.Tensor) -> torch.Tensor:
        q = self.native.rope_store(
            qkv.contiguous(),
            self.heads,
            self.positions,
            self.tables,
            self.pool.layer(layer),
            self.slots,
            (self.mirror.k[layer], self.mirror.v[layer]),
            self.mirror_at,
        )
        return self.mirror.attend(layer, q)
