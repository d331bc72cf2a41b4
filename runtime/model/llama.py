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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from radixcache.runtime.config import ModelConfig, expected_shapes
from radixcache.runtime.huge_pages import HugePageArena
from radixcache.runtime.kv.mirror import MirrorStep
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.model import attention
from radixcache.runtime.model.attention import (
    DecodeMeta,
    decode_attention,
)
from radixcache.runtime.model.batch import DecodeBatch, ForwardLogits, PrefillChunk
from radixcache.runtime.model.block_linear import head_activations, resolve_activations
from radixcache.runtime.model.chunk_rows import chunk_part
from radixcache.runtime.model.fused_decode import FusedDecode
from radixcache.runtime.model.linear import Linear
from radixcache.runtime.model.native_layers import NativeLayers, silu_mul
from radixcache.runtime.model.quant import check_gguf_activations, check_quant, make_linear
from radixcache.runtime.model.rope import _rope_signed, rope_tables
from radixcache.runtime.model.staged import LayerRun, RowPart, staged_pass

if TYPE_CHECKING:
    from radixcache.runtime.model.block_linear import BlockWeight
    from radixcache.runtime.native.ops import NativeDecodeOps

DEFAULT_CHUNK = 512
MIN_HUGE_WEIGHTS = 32 << 20  # smaller models keep their weights where they are (the TLB reaches most of them)


@dataclass(frozen=True, slots=True)
class _Layer:
    ln_in: torch.Tensor
    qkv: Linear
    o: Linear
    ln_post: torch.Tensor
    gate_up: Linear
    down: Linear


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in at least float32 (as Hugging Face Llama does), returned in x's dtype."""
    wide = torch.promote_types(x.dtype, torch.float32)
    xf = x if x.dtype == wide else x.to(wide)  # no conversion calls where there is nothing to convert
    xf = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (xf if xf.dtype == x.dtype else xf.to(x.dtype))


def _native_ops(required: bool) -> NativeDecodeOps | None:
    """The native RMSNorm and decode attention (runtime.native.ops). quant="gguf" needs the library (`required`);
    a float32 model takes them where they build (about 2 ms of SmolLM2's batch-1 step), else PyTorch's."""
    from radixcache.runtime.native import NativeBuildError
    from radixcache.runtime.native.ops import NativeDecodeOps

    try:
        return NativeDecodeOps()
    except NativeBuildError:
        if required:
            raise
        return None


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """One tensor from a pass's parts, without a copy when there is only one."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _streamed_sizes(weights: Mapping[str, torch.Tensor], dtype: torch.dtype, tied: bool) -> list[int]:
    """The bytes of each float matrix a decode step streams, in `dtype`: the projections and the output head."""
    size = torch.empty((), dtype=dtype).element_size()
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    names = [n for n in weights if n.endswith("_proj.weight")] + [head]
    return [weights[n].numel() * size for n in names if n in weights]


class LlamaModel:
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
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        quant: str = "none",
        blocks: Mapping[str, BlockWeight] | None = None,
        huge_weights: bool = True,
        gguf_activations: str | None = None,
    ) -> None:
        if config.num_kv_heads < 1 or config.num_heads % config.num_kv_heads:
            raise ValueError(f"num_heads {config.num_heads} is not a multiple of num_kv_heads {config.num_kv_heads}")
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        check_quant(quant, self.device, dtype)
        check_gguf_activations(gguf_activations, quant)
        if quant == "gguf" and blocks is not None and not blocks:  # loaded with keep_blocks: the file has none
            raise ValueError(
                "quant='gguf' runs a GGUF file's quantised blocks (Q4_0 to Q8_0, Q4_K to Q6_K), and this model's "
                "file has none: its matrices are stored unquantised (F32, F16 or BF16); run it with quant='none'"
            )
        if quant == "gguf" and not blocks:
            raise ValueError(
                "quant='gguf' needs the GGUF file's blocks: load a GGUF model with load_model(..., keep_blocks=True)"
            )
        self.quant = quant
        # The block kernels' activations mode (None without GGUF blocks): it changes the K/V computed, so the disk
        # tier's fingerprint names it (kv.tier.fingerprint)
        self.gguf_activations = resolve_activations(gguf_activations) if quant == "gguf" else None
        self.weights_id: str | None = None  # what the disk tier's fingerprint names these weights by (engine)
        # RMSNorm and the decode mirror's attention run natively for small batches: always with quant="gguf", and
        # for any float32 model on the CPU where the native library builds (else PyTorch's, as before)
        self.native: NativeDecodeOps | None = None
        if quant == "gguf" or (self.device.type == "cpu" and dtype == torch.float32):
            self.native = _native_ops(required=quant == "gguf")

        # The native kernels take sizes from the config: a smaller weight would be read past its end, not refused
        shapes = expected_shapes(replace(config, tie_embeddings=False, attention_bias=True))  # optional ones too

        def w(name: str) -> torch.Tensor:
            if name not in weights:
                raise KeyError(f"weight {name!r} is missing")
            if tuple(weights[name].shape) != shapes[name]:
                raise ValueError(f"weight {name!r} has shape {tuple(weights[name].shape)}, expected {shapes[name]}")
            return weights[name].to(device=self.device, dtype=dtype).contiguous()

        # The float matrices a CPU decode streams every token go to huge-page memory (runtime.huge_pages: the TLB,
        # not the kernels, held the float32 decode back). Not the GGUF blocks: their kernels are bound by unpacking
        # (gguf decode 138 against 133 tok/s from huge pages, noise); nor fp16's packed copies (fbgemm's own).
        tied = config.tie_embeddings or "lm_head.weight" not in weights
        arena = None
        if huge_weights and quant == "none" and self.device.type == "cpu":
            room = HugePageArena.room(_streamed_sizes(weights, dtype, tied))
            arena = HugePageArena(room) if room >= MIN_HUGE_WEIGHTS else None

        def streamed(weight: torch.Tensor) -> torch.Tensor:
            return weight if arena is None else arena.place(weight)

        def linear(
            names: Sequence[str],
            bias: torch.Tensor | None = None,
            weight: torch.Tensor | None = None,
            activations: str | None = None,
        ) -> Linear:
            """One layer for the weights `names` fused by rows (or `weight`, already loaded), with their GGUF
            blocks where every one of them has blocks (`activations`: their kernel's, None for the default)."""
            if weight is None:
                weight = w(names[0]) if len(names) == 1 else torch.cat([w(n) for n in names])
            parts = None
            if quant == "gguf" and blocks is not None and all(n in blocks for n in names):
                parts = [blocks[n] for n in names]
            elif weight is not self.embed:
                weight = streamed(weight)  # the dense form is what a decode streams (self.embed already is)
            return make_linear(weight, bias, quant, parts, activations or gguf_activations)

        self.embed = w("model.embed_tokens.weight")
        if tied:
            self.embed = streamed(self.embed)  # the output head's weight too: read every token
        # The output head takes float activations beside int8 ones: int8 rounding of the final hidden state moved a
        # greedy answer (docs/runtime.md, "int8 activations for GGUF blocks"); 16-bit rounding is its own.
        head = ["model.embed_tokens.weight" if tied else "lm_head.weight"]
        head_mode = head_activations(gguf_activations) if quant == "gguf" else None  # the variable means nothing else
        self.lm_head = linear(head, None, self.embed if tied else None, head_mode)
        self.norm = w("model.norm.weight")
        self.layers: list[_Layer] = []
        for i in range(config.num_layers):
            pre = f"model.layers.{i}."
            att = pre + "self_attn."
            bias = None
            if config.attention_bias or att + "q_proj.bias" in weights:
                bias = torch.cat([w(att + f"{p}_proj.bias") for p in "qkv"])
            self.layers.append(
                _Layer(
                    ln_in=w(pre + "input_layernorm.weight"),
                    qkv=linear([att + f"{p}_proj.weight" for p in "qkv"], bias),
                    o=linear([att + "o_proj.weight"]),
                    ln_post=w(pre + "post_attention_layernorm.weight"),
                    gate_up=linear([pre + "mlp.gate_proj.weight", pre + "mlp.up_proj.weight"]),
                    down=linear([pre + "mlp.down_proj.weight"]),
                )
            )
        self.cos, self.sin = rope_tables(config, self.device, dtype)
        half = config.head_dim // 2
        self.signed_sin = torch.cat((-self.sin[:, :half], self.sin[:, half:]), dim=-1)  # see _rope_signed
        self.native_layers = NativeLayers.build(self) if self.native is not None else None  # None: eager layers only

    # ------------------------------------------------------------------ public API

    def new_pool(self, num_blocks: int, page_size: int) -> KVPool:
        """An empty KV pool matching this model's shape, dtype and device."""
        return KVPool(self.config, num_blocks, page_size, dtype=self.dtype, device=self.device)

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
        ids, positions, slots = (_cat([getattr(p, f) for p in parts]) for f in ("ids", "positions", "slots"))
        hidden = self._layers(ids, positions, LayerRun(pool, slots, fused or attend, prefill, b))
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

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, how: LayerRun) -> torch.Tensor:
        """The decoder layers over rows `[decode rows | prefill-chunk rows]` (model.linear: a kernel may treat the
        two kinds differently, never by the batch they share); a FusedDecode replaces RoPE to attention."""
        x = F.embedding(ids, self.embed)
        fused = how.attend if isinstance(how.attend, FusedDecode) else None
        native = self.native_layers.run(x, fused) if self.native_layers and fused is not None else None
        if native is not None:
            return native
        rope = self.rope_at(positions)  # once per forward
        for i in range(len(self.layers)):
            x = self.run_layer(i, x, rope, how)
        return x

    def rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables' rows `(cos, signed sin)` `[T, 1, head_dim]` for rows at `positions`."""
        return self.cos[positions].unsqueeze(1), self.signed_sin[positions].unsqueeze(1)

    def run_layer(
        self, i: int, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], how: LayerRun
    ) -> torch.Tensor:
        """Decoder layer `i` over rows `x` `[T, hidden]` (`[decode rows | chunk rows]`, at the positions `rope` was
        taken at): their new K/V go to `how.slots` of the pool, `how.attend` reads them. Returns the output rows."""
        cfg = self.config
        pool, slots, attend, prefill, decode_rows = how.pool, how.slots, how.attend, how.prefill, how.decode_rows
        layer = self.layers[i]
        t = x.shape[0]
        h, kvh, d, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
        qk_size = (h + kvh) * d
        qkv = layer.qkv(self._norm(x, layer.ln_in, eps), prefill, decode_rows=decode_rows)
        if isinstance(attend, FusedDecode):
            att = attend(i, qkv)
        else:
            qk = _rope_signed(qkv[:, :qk_size].reshape(t, h + kvh, d), *rope)  # q and k rotated in one pass
            q, k = qk[:, :h].contiguous(), qk[:, h:]  # SDPA's fused CPU kernel wants a dense q
            v = qkv[:, qk_size:].reshape(t, kvh, d)
            pool.write(i, slots, k, v)
            att = attend(i, q, k, v)
        x = x + layer.o(att.reshape(t, h * d), prefill, decode_rows=decode_rows)
        gated = layer.gate_up(self._norm(x, layer.ln_post, eps), prefill, decode_rows=decode_rows)
        # the native SiLU wherever the native layers may run these rows: a row gets their bits either way
        native_silu = self.quant == "gguf" or (self.native_layers is not None and self.native_layers.takes(t))
        act = silu_mul(gated, self.native if native_silu else None)
        return x + layer.down(act, prefill, decode_rows=decode_rows)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm: the native one for the small batches of quant="gguf" (runtime.native.ops), else `rms_norm`."""
        if self.native is None:
            return rms_norm(x, weight, eps)
        return self.native.rms_norm(x, weight, eps, rms_norm)
