"""The decoder layers of a Llama-family model: the layer of `LlamaModel` (model.llama) that runs them over rows.

`_layers` embeds a pass's rows and runs every decoder layer over them (all at once natively, model.native_layers,
for a decode-only pass that takes it); `run_layer` is one layer: RMSNorm, the fused q/k/v product, rotate-half RoPE
at the rows' absolute positions (q and k rotated in one pass), the new K/V written to the pool, attention as the
pass's `LayerRun` says (or a FusedDecode's native call from RoPE to attention), the output product, SwiGLU.

Invariants: a layer writes its rows' K/V into the pool before anything attends over them; the rows are
`[decode rows | prefill-chunk rows]`, and a product may treat the two kinds differently, never by the batch they
share (model.linear); the native SiLU runs wherever the native layers may run the rows, so a row gets their bits
either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixcache.runtime.model.fused_decode import FusedDecode
from radixcache.runtime.model.llama_weights import LlamaWeights
from radixcache.runtime.model.native_layers import silu_mul
from radixcache.runtime.model.rope import _rope_signed
from radixcache.runtime.model.staged import LayerRun


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in at least float32 (as Hugging Face Llama does), returned in x's dtype."""
    wide = torch.promote_types(x.dtype, torch.float32)
    xf = x if x.dtype == wide else x.to(wide)  # no conversion calls where there is nothing to convert
    xf = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (xf if xf.dtype == x.dtype else xf.to(x.dtype))


class DecoderLayers(LlamaWeights):
    """`_layers`, `run_layer`, `rope_at` and `_norm`: the decoder layers over a pass's rows."""

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
