"""The fingerprint of everything that makes a page's KV bytes reusable, for the root of the page hashes.

Two engines may share stored pages only when they would compute the same bytes: the same weights, read in the same
format (`quant`), stored in the same KV dtype, page size and layout, rotated by the same rope. Each of those goes into
the fingerprint, so an engine that differs in any of them finds zero pages (the namespace joins at the hash root).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

import torch

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.kv.pool import KVPool

FORMAT_VERSION = 1
_SAMPLE = 1 << 20  # bytes read at each sampled offset of a weights file
_SAMPLES = 16


def file_digest(path: str) -> str:
    """A digest of a weights file or directory: size plus 16 spread 1 MiB samples and the last MiB of each file.

    Sampled, not whole: hashing a multi-GB checkpoint would delay every start by seconds. Two files of equal size
    that differ only outside every sample would collide; a re-quantised or different checkpoint changes the bytes
    everywhere (and usually the size).
    """
    files = [path]
    if os.path.isdir(path):
        files = sorted(
            os.path.join(path, name)
            for name in os.listdir(path)
            if name.endswith((".safetensors", ".gguf", ".bin")) or name == "config.json"
        )
    h = hashlib.blake2b(digest_size=16)
    for name in files:
        size = os.path.getsize(name)
        h.update(f"{os.path.basename(name)}:{size}".encode())
        with open(name, "rb") as f:
            offsets = {min(max(size - _SAMPLE, 0), i * size // _SAMPLES) for i in range(_SAMPLES)}
            for offset in sorted(offsets | {max(size - _SAMPLE, 0)}):
                f.seek(offset)
                h.update(f.read(_SAMPLE))
    return h.hexdigest()


def weights_digest(weights: Mapping[str, torch.Tensor]) -> str:
    """A digest of in-memory weights (no file to read: a model built in code): every tensor's name, shape, dtype
    and bytes."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(weights):
        t = weights[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def kv_fingerprint(config: ModelConfig, pool: KVPool, *, weights: str, quant: str) -> str:
    """`label#digest`: a readable label (model, weight format, KV dtype, page size) and a digest of every field."""
    fields = {
        "version": FORMAT_VERSION,
        "weights": weights,
        "quant": quant,
        "kv_dtype": str(pool.dtype),
        "page_size": pool.page_size,
        "layout": f"layers{pool.num_layers}x2xpage{pool.page_size}xkvheads{pool.kv_heads}xdim{pool.head_dim}",
        "rope": f"theta={config.rope_theta!r},max_position={config.max_position}",
        "model": f"{config.arch},{config.hidden_size},{config.num_heads},{config.num_kv_heads},{config.head_dim}",
    }
    digest = hashlib.blake2b(repr(sorted(fields.items())).encode(), digest_size=16).hexdigest()
    dtype = str(pool.dtype).removeprefix("torch.")
    return f"{config.name} quant={quant} kv={dtype} page={pool.page_size}#{digest}"
