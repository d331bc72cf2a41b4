"""The weights of a Llama-family model: the base layer of `LlamaModel` (model.llama), which loads them.

`LlamaWeights.__init__` checks every weight against the config's shapes (the native kernels take sizes from the
config: a smaller weight would be read past its end, not refused), fuses q/k/v and gate/up into one matrix each,
makes every matrix a model.linear layer (dense, fp16, or the GGUF file's own blocks), places the float matrices a
CPU decode streams in huge-page memory (runtime.huge_pages), builds the RoPE tables, and takes the native RMSNorm
and decode attention (runtime.native.ops) where they apply. Nothing here runs a pass.

Invariants: after construction the weights never change; `layers[i]` holds layer i's norms and products; the
output head takes float activations beside int8 ones (model.block_linear.head_activations).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from radixcache.runtime.config import ModelConfig, expected_shapes
from radixcache.runtime.huge_pages import HugePageArena
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.model.block_linear import head_activations, resolve_activations
from radixcache.runtime.model.linear import Linear
from radixcache.runtime.model.native_layers import NativeLayers
from radixcache.runtime.model.quant import check_gguf_activations, check_quant, make_linear
from radixcache.runtime.model.rope import rope_tables

if TYPE_CHECKING:
    from radixcache.runtime.model.block_linear import BlockWeight
    from radixcache.runtime.native.ops import NativeDecodeOps

MIN_HUGE_WEIGHTS = 32 << 20  # smaller models keep their weights where they are (the TLB reaches most of them)


@dataclass(frozen=True, slots=True)
class _Layer:
    ln_in: torch.Tensor
    qkv: Linear
    o: Linear
    ln_post: torch.Tensor
    gate_up: Linear
    down: Linear


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


def _streamed_sizes(weights: Mapping[str, torch.Tensor], dtype: torch.dtype, tied: bool) -> list[int]:
    """The bytes of each float matrix a decode step streams, in `dtype`: the projections and the output head."""
    size = torch.empty((), dtype=dtype).element_size()
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    names = [n for n in weights if n.endswith("_proj.weight")] + [head]
    return [weights[n].numel() * size for n in names if n in weights]


class LlamaWeights:
    """A model's weights, loaded and laid out for the forward pass; its arguments are `LlamaModel`'s (model.llama:
    huge pages for the streamed float matrices unless `huge_weights=False`, the GGUF blocks' activations mode)."""

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

    def new_pool(self, num_blocks: int, page_size: int) -> KVPool:
        """An empty KV pool matching this model's shape, dtype and device."""
        return KVPool(self.config, num_blocks, page_size, dtype=self.dtype, device=self.device)
