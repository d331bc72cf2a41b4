"""The fingerprint of everything that makes a page's KV bytes reusable, for the root of the page hashes.

Two engines may share stored pages only when they would compute the same bytes: the same weights, read in the same
format (`quant`, and for GGUF blocks the kernels' activations mode), stored in the same KV dtype, page size and
layout, rotated by the same rope (its base and its scaling: Llama 3.1's, linear, YaRN). Each of those goes into the
fingerprint, so an engine that differs in any of them finds zero pages (the namespace joins at the hash root).
Weights read from files are named by a digest of every byte of them (radixcache.runtime.kv.tier.digest_cache keeps
each file's digest by its identity, so only a new or changed file is read).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

import torch

from radixcache.runtime.config import ModelConfig
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.kv.tier.digest_cache import DigestCache, digest_cache_dir

FORMAT_VERSION = 1


def file_digest(path: str, cache_dir: str | None = None) -> str:
    """A digest of a weights file or directory: each file's name, size and the digest of every byte it holds.

    A directory counts its `.safetensors`, `.gguf` and `.bin` files and `config.json`. Each file's content digest is
    read from the digest cache (`digest_cache_dir()`, or `cache_dir`) when the file's identity (device, inode,
    size, mtime_ns, ctime_ns) is the one it was hashed under, so a start after the first reads no weights here.
    """
    files = [path]
    if os.path.isdir(path):
        files = sorted(
            os.path.join(path, name)
            for name in os.listdir(path)
            if name.endswith((".safetensors", ".gguf", ".bin")) or name == "config.json"
        )
    cache = DigestCache(cache_dir if cache_dir is not None else digest_cache_dir())
    h = hashlib.blake2b(digest_size=16)
    for name in files:
        size, digest = cache.content_digest(name)
        h.update(f"{os.path.basename(name)}:{size}:{digest}\n".encode())
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


def kv_fingerprint(
    config: ModelConfig, pool: KVPool, *, weights: str, quant: str, activations: str | None = None
) -> str:
    """`label#digest`: a readable label (model, weight format, KV dtype, page size) and a digest of every field.
    `activations`: the GGUF block kernels' activations (engine.assembly's `activations_id`; None for other
    formats), whose rounding changes the K/V a pass computes (int8 against float: logits 0.04 apart where float
    noise is 1e-5)."""
    fields: dict[str, object] = {
        "version": FORMAT_VERSION,
        "weights": weights,
        "quant": quant,
        "kv_dtype": str(pool.dtype),
        "page_size": pool.page_size,
        "layout": f"layers{pool.num_layers}x2xpage{pool.page_size}xkvheads{pool.kv_heads}xdim{pool.head_dim}",
        "rope": f"theta={config.rope_theta!r},max_position={config.max_position}",
        "model": f"{config.arch},{config.hidden_size},{config.num_heads},{config.num_kv_heads},{config.head_dim}",
    }
    if activations is not None:  # only then: the fingerprints of other formats' caches stay what they were
        fields["activations"] = activations
    if config.rope_scaling is not None:  # only then, likewise: unscaled models keep their fingerprints
        fields["rope_scaling"] = repr(config.rope_scaling)
    digest = hashlib.blake2b(repr(sorted(fields.items())).encode(), digest_size=16).hexdigest()
    dtype = str(pool.dtype).removeprefix("torch.")
    return f"{config.name} quant={quant} kv={dtype} page={pool.page_size}#{digest}"
