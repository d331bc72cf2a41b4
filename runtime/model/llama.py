"""A Llama-family decoder (Llama, SmolLM2, Qwen2, Mistral) that reads and writes its KV in the paged pool.

RMSNorm, rotary embeddings in rotate-half layout with positions offset by the cached prefix, grouped-query
attention over the pool (runtime.model.attention), SwiGLU MLP, tied embeddings and Qwen2's q/k/v bias. Weights come
in Hugging Face names and `[out, in]` layout; q/k/v and gate/up are fused into one matrix each at load, and every
matrix becomes a model.linear layer (dense; fp16 weights with `quant="fp16"`; the GGUF file's own blocks for small
batches with `quant="gguf"` and `blocks`, from `load_model(..., keep_blocks=True)`). On the CPU in float32 (and
always with `quant="gguf"`) RMSNorm of up to 4 rows and the decode mirror's attention are native calls
(runtime.native.ops) where the native library builds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from radixcache.runtime.kv.mirror import MirrorStep
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.model import attention
from radixcache.runtime.model.attention import (
    DecodeMeta,
    decode_attention,
)
from radixcache.runtime.model.batch import DecodeBatch, ForwardLogits, PrefillChunk
from radixcache.runtime.model.chunk_rows import chunk_part
from radixcache.runtime.model.fused_decode import FusedDecode
from radixcache.runtime.model.llama_layers import DecoderLayers, rms_norm
from radixcache.runtime.model.staged import LayerRun, RowPart, staged_pass

__all__ = ["DEFAULT_CHUNK", "LlamaModel", "rms_norm"]

DEFAULT_CHUNK = 512


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """One tensor from a pass's parts, without a copy when there is only one."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class LlamaModel(DecoderLayers):
    """The forward pass. Stateless between calls: all KV lives in the KVPool passed to each call.

    On the CPU with quant="none", the float matrices each decode step streams (the projections and the output head)
    are copied into memory backed by transparent huge pages (runtime.huge_pages), when there are at least
    MIN_HUGE_WEIGHTS bytes of them and unless `huge_weights=False`: the same values, read with 512 times fewer TLB
    entries. A caller that keeps the `weights` it passed holds those matrices twice (the fused q/k/v and gate/up
    ones were always copies); `huge_weights=False` shares the unfused ones instead.
    With quant="gguf", `gguf_activations` is the block kernels' activations mode for every block matrix but the output
    head (model.block_linear.ACTIVATIONS; None: `$RADIXCACHE_GGUF_ACTIVATIONS` or the default, "int16-decode"),
    which takes "int16-decode" beside the 16-bit modes and float activations beside every other
    (model.block_linear.head_activations).

    Assembled from layers on one object: model.llama_weights (loading and laying out the weights, the base),
    model.llama_layers (the decoder layers over a pass's rows); this module runs the passes.
    """

    def prefill(
        self,
        token_ids: Sequence[int] | torch.Tensor,
        start: int,
        block_table: Sequence[int] | torch.Tensor,
        pool: KVPool,
        *,
        chunk_size: int = DEFAULT_CHUNK,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Compute `token_ids` at positions `start ..` over the KV already in the pool for positions `< start`.

        Writes their K/V into the pages of `block_table` (which must cover every position up to the end), in
        chunks of `chunk_size` tokens so that long prompts do not spike memory. Returns the logits of the last
        token `[vocab]` (float32), or of every token `[T, vocab]` with `all_logits`.
        """
        ids = torch.as_tensor(token_ids, dtype=torch.int64).to(self.device)
        table = torch.as_tensor(block_table, dtype=torch.int64).to(self.device)
        t = ids.numel()
        if t == 0:
            raise ValueError("prefill needs at least one token")
        self.check_positions(start + t)
        need = -(-(start + t) // pool.page_size)
        if table.numel() < need:
            raise ValueError(f"block table of {table.numel()} pages cannot hold {start + t} tokens")
        if not all_logits:  # the engine's path: one chunk per pass
            out = None
            for lo in range(0, t, chunk_size):
                chunk = PrefillChunk(ids[lo : lo + chunk_size], start + lo, table)
                out = self.forward(pool, chunks=[chunk]).chunks
            assert out is not None
            return out[0]
        outs = []
        for lo in range(0, t, chunk_size):
            part = chunk_part(self, PrefillChunk(ids[lo : lo + chunk_size], start + lo, table), pool)
            outs.append(self._layers(part.ids, part.positions, LayerRun(pool, part.slots, part.attend, True, 0)))
        return self.logits(torch.cat(outs), prefill=True, decode_rows=0)

    def decode(
        self,
        token_ids: Sequence[int] | torch.Tensor,
        meta: DecodeMeta,
        pool: KVPool,
        mirror: MirrorStep | None = None,
    ) -> torch.Tensor:
        """One new token per sequence (token i at position `meta.lengths[i] - 1`). Returns logits `[B, vocab]`.

        With `mirror` (from kv.mirror, prepared for the same sequences and lengths) attention reads the mirror's
        contiguous rows instead of the pages; the new K/V go to both. The caller commits the step.
        """
        out = self.forward(pool, decode=DecodeBatch(token_ids, meta, mirror)).decode
        assert out is not None
        return out

    def forward(
        self, pool: KVPool, *, decode: DecodeBatch | None = None, chunks: Sequence[PrefillChunk] = ()
    ) -> ForwardLogits:
        """One pass over the running decodes and the prefill chunks of any number of sequences (model.batch).

        Rows are `[decodes | chunk 0 | chunk 1 | ...]`: the products run once over all of them, attention per part
        (decodes over the mirror or their pages, each chunk over its sequence's cached prefix and itself). Every
        new K/V is written to the pool. Returns the decodes' logits and each chunk's last-position logits; a chunk
        given a part of the layers (`PrefillChunk.layers`) runs those only (model.staged).
        """
        if decode is None and not chunks:
            raise ValueError("a forward pass needs decodes or prefill chunks")
        dev = self.device
        parts: list[RowPart] = []
        b = 0
        if decode is not None:
            meta = decode.meta
            b = meta.batch
            if len(decode.token_ids) != b:
                raise ValueError(f"{len(decode.token_ids)} decode tokens for {b} sequences")
            if decode.mirror is not None and decode.mirror.lengths != meta.lengths:
                raise ValueError(
                    f"mirror step lengths {decode.mirror.lengths} do not match the decode's {meta.lengths}"
                )
            self.check_positions(max(meta.lengths))

            def attend_decodes(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                return self._decode_attend(layer, q, k, v, decode, pool)

            ids = torch.as_tensor(decode.token_ids, dtype=torch.int64, device=dev)
            parts.append(RowPart(ids, meta.positions_t, meta.slots, attend_decodes, range(len(self.layers))))
        parts.extend(chunk_part(self, chunk, pool) for chunk in chunks)
        # `prefill` lets a linear kind pick its summation order for a pure prefill (model.linear keeps F.linear for
        # 17-63 rows there); a mixed pass takes the fastest kernel for its rows, as a decode batch does.
        prefill = bool(chunks) and decode is None
        if any(part.layers != range(len(self.layers)) for part in parts):
            return staged_pass(self, pool, parts, b, prefill, FusedDecode.build(self, pool, decode, 0))
        sizes = [part.ids.numel() for part in parts]

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            outs, row = [], 0
            for part, n in zip(parts, sizes, strict=True):
                outs.append(part.attend(layer, q[row : row + n], k[row : row + n], v[row : row + n]))
                row += n
            return _cat(outs)

        fused = FusedDecode.build(self, pool, decode, len(chunks))
        if fused is not None:  # the native layers may run the head in their own call
            fused.head_request = (self.norm, self.config.rms_norm_eps, self.lm_head)
        ids, positions, slots = (_cat([getattr(p, f) for p in parts]) for f in ("ids", "positions", "slots"))
        hidden = self._layers(ids, positions, LayerRun(pool, slots, fused or attend, prefill, b))
        if fused is not None and fused.head_result is not None:
            return ForwardLogits(fused.head_result[0], None, decode_best=fused.head_result[1])
        if fused is not None and self.native_layers is not None:  # decodes only: the head and argmax natively
            head = self.native_layers.head(hidden, self.norm, self.config.rms_norm_eps, self.lm_head)
            if head is not None:
                return ForwardLogits(head[0], None, decode_best=head[1])
        if chunks:  # the decode rows and each chunk's last row: the only logits anyone reads
            ends = list(itertools.accumulate(sizes))[1 if decode is not None else 0 :]
            wanted = [*range(b), *(end - 1 for end in ends)]
            if len(wanted) < hidden.shape[0]:
                hidden = hidden.index_select(0, torch.tensor(wanted, device=dev))
        logits = self.logits(hidden, prefill=prefill, decode_rows=b)
        return ForwardLogits(logits[:b] if decode is not None else None, logits[b:] if chunks else None)

    def logits(self, hidden: torch.Tensor, prefill: bool, decode_rows: int) -> torch.Tensor:
        """The final norm and the output head over rows `hidden`: float32 logits `[T, vocab]`."""
        norm = self._norm(hidden, self.norm, self.config.rms_norm_eps)
        return self.lm_head(norm, prefill, decode_rows=decode_rows).float()

    # ------------------------------------------------------------------ private

    def check_positions(self, end: int) -> None:
        """Refuse a sequence of `end` positions past the model's max_position."""
        if end > self.config.max_position:
            raise ValueError(f"sequence of {end} tokens exceeds the model's max_position {self.config.max_position}")

    def _decode_attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decode: DecodeBatch, pool: KVPool
    ) -> torch.Tensor:
        if decode.mirror is not None:
            decode.mirror.write(layer, k, v)
            return decode.mirror.attend(layer, q)
        k_pages, v_pages = pool.layer(layer)
        meta, native = decode.meta, self.native
        in_place = attention.reads_pages_in_place(q.device)  # else the gather path (tests of it patch this)
        if meta.batch == 1 and native is not None and in_place and native.supports_pages(k_pages):  # one sequence
            return native.attend_pages(q, k_pages, v_pages, meta.block_tables[0], meta.lengths[0] - 1)
        return decode_attention(q, k_pages, v_pages, meta)
