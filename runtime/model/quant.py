"""The weight formats (`quant`): which linear kind each builds, and where each can run.

"none": DenseLinear in the model's dtype; "fp16": Float16Linear (CPU, fbgemm); "gguf": BlockLinear over the GGUF
file's own blocks (Q4_0 .. Q8_0 and the K-quants; CPU, a native kernel built on first use), whose activations
mode (`check_gguf_activations`) picks that kernel. See model.linear and model.block_linear.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixcache.runtime.model.block_linear import ACTIVATIONS, BlockLinear, BlockWeight, resolve_activations
from radixcache.runtime.model.linear import DenseLinear, Float16Linear, Linear

QUANT_MODES = ("none", "fp16", "gguf")


def make_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    quant: str = "none",
    blocks: Sequence[BlockWeight] | None = None,
    activations: str | None = None,
) -> Linear:
    """The linear layer for `quant` ("none", "fp16" or "gguf"); weight `[out, in]`. With "gguf", `blocks` are the
    weight's GGUF blocks (one part per fused source tensor); a weight without them stays dense. `activations`: the
    block kernel's (model.block_linear.ACTIVATIONS; None: `$RADIXCACHE_GGUF_ACTIVATIONS` or the default)."""
    if quant == "none" or (quant == "gguf" and not blocks):
        return DenseLinear(weight, bias)
    if quant == "fp16":
        return Float16Linear(weight, bias)
    if quant == "gguf":
        return BlockLinear(weight, bias, blocks, activations)  # type: ignore[arg-type]
    raise ValueError(f"quant must be one of {', '.join(QUANT_MODES)}, got {quant!r}")


def check_quant(quant: str, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse a quantised mode where its kernels cannot run (raises ValueError that says why)."""
    if quant not in QUANT_MODES:
        raise ValueError(f"quant must be one of {', '.join(QUANT_MODES)}, got {quant!r}")
    if quant == "none":
        return
    kernels = "fbgemm kernels" if quant == "fp16" else "a native kernel"
    if device.type != "cpu":
        raise ValueError(f"quant={quant!r} runs on the CPU only ({kernels}); got device {device}")
    if dtype != torch.float32:
        raise ValueError(f"quant={quant!r} needs float32 activations; got dtype {dtype}")
    if quant == "fp16" and not {"fbgemm", "x86"} & set(torch.backends.quantized.supported_engines):
        raise ValueError(f"quant={quant!r} needs PyTorch's fbgemm kernels, which this torch build lacks")
    if quant == "gguf":
        from radixcache.runtime.native import blockdot

        blockdot()  # builds it now, or raises NativeBuildError (a ValueError) that says what is missing


def check_gguf_activations(activations: str | None, quant: str) -> None:
    """Refuse a GGUF activations mode outside model.block_linear.ACTIVATIONS, or one given for another weight format
    (None: `$RADIXCACHE_GGUF_ACTIVATIONS` or the default, with any format; the variable is checked here too, so that
    a mode it misspells is refused before a model loads)."""
    if activations is None:
        if quant == "gguf":
            resolve_activations(None)
        return
    if activations not in ACTIVATIONS:
        raise ValueError(f"gguf_activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")
    if quant != "gguf":
        raise ValueError(f"gguf_activations={activations!r} applies to quant='gguf' only; got quant={quant!r}")
