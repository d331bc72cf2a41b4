"""What the Engine is built from, beyond its own parts: the model (loaded from a name or a path, or wrapped from a
loaded object), the identity of its weights for the disk tier's fingerprint, the KV pool's size, the KV manager
with the tiers and event log under it, the decode mirror, and the kernels of its products. Each takes a validated
EngineConfig (runtime.engine.engine_config)."""

from __future__ import annotations

import os
from typing import Any

import torch

from radixcache import RadixCache
from radixcache.policy.admission import AdmissionPolicy
from radixcache.runtime.engine.engine_config import DEFAULT_KV_MEMORY, DEFAULT_MIRROR_MEMORY, EngineConfig
from radixcache.runtime.kv.events import KVEventLog
from radixcache.runtime.kv.manager import KVManager
from radixcache.runtime.kv.mirror import DecodeMirror
from radixcache.runtime.kv.pool import blocks_for_budget, check_fits, page_bytes, parse_memory
from radixcache.runtime.kv.retention import RetentionPolicy
from radixcache.runtime.kv.tier.build import build_tiers
from radixcache.runtime.kv.tier.coordinator import KVTiers
from radixcache.runtime.kv.tier.fingerprint import file_digest, weights_digest
from radixcache.runtime.model.block_linear import BlockLinear
from radixcache.runtime.model.kernel_plan import KernelPlan
from radixcache.runtime.model.llama import LlamaModel


def build_model(config: EngineConfig) -> tuple[LlamaModel, Any, str]:
    """(the model, its tokenizer or None, the weights' identity for a disk tier: "" without one)."""
    model, tokenizer = config.model, config.tokenizer
    torch_dtype = config.torch_dtype
    if isinstance(model, (str, os.PathLike)):
        from radixcache.runtime.loading import load_model

        load_dtype = torch.float32 if torch_dtype == torch.float64 else torch_dtype  # float64: tests only
        model = load_model(str(model), dtype=load_dtype, device=config.device, keep_blocks=config.quant == "gguf")
    weights_id = weights_identity(model) if config.cache_dir is not None and config.enable_cache else ""
    if isinstance(model, LlamaModel):
        if config.quant != "none" and config.quant != model.quant:
            raise ValueError(f"quant={config.quant!r} applies when the engine builds the model; pass it to LlamaModel")
        if config.gguf_activations is not None:
            raise ValueError("gguf_activations applies when the engine builds the model; pass it to LlamaModel")
        return model, tokenizer, weights_id
    blocks = getattr(model, "blocks", None)
    built = LlamaModel(
        model.config, model.weights, dtype=torch_dtype, device=config.device, quant=config.quant, blocks=blocks,
        gguf_activations=config.gguf_activations,
    )  # fmt: skip
    if weights_id:
        built.weights_id = weights_id  # an engine built later on this model fingerprints the same
    return built, tokenizer if tokenizer is not None else getattr(model, "tokenizer", None), weights_id


def pool_blocks(config: EngineConfig, model: LlamaModel) -> int:
    """The KV pool's pages: `capacity_blocks`, else as many as `kv_memory` (default 512 MiB) holds; a ValueError
    naming the option when they would be more than the model's device has."""
    if config.capacity_blocks is not None:
        blocks, option = config.capacity_blocks, f"capacity_blocks={config.capacity_blocks}"
    else:
        budget = config.kv_memory if config.kv_memory is not None else DEFAULT_KV_MEMORY
        blocks, option = blocks_for_budget(model.config, budget, config.page_size, model.dtype), f"kv_memory={budget!r}"
    check_fits(blocks * page_bytes(model.config, config.page_size, model.dtype), model.device, option)
    return blocks


def build_kv(
    config: EngineConfig,
    cache: RadixCache,
    pool: Any,
    fingerprint: str,
    retention: RetentionPolicy,
    admission: AdmissionPolicy,
    max_pinned_blocks: int,
) -> tuple[KVTiers | None, KVEventLog | None, KVManager]:
    """The tiers under the pool (host memory, disk) and the KV event log, where the cache is on, and the KV manager
    over them and the tree."""
    tiers, events = None, None
    if config.enable_cache:
        tiers = build_tiers(
            cache,
            pool,
            host_kv_memory=config.host_kv_memory,
            cache_dir=None if config.cache_dir is None else os.fspath(config.cache_dir),
            cache_dir_size=config.cache_dir_size,
            write_policy=config.write_policy,
            load_back=config.load_back,
            prefetch_policy=config.prefetch_policy,
            prefetch_timeout_ms=config.prefetch_timeout_ms,
            prefetch_pages_per_step=config.prefetch_pages_per_step,
            fingerprint=fingerprint,
        )
        if config.kv_events:  # after the tiers: the log chains their eviction listener
            hasher = tiers.tiered.hasher if tiers is not None else None  # one hash per evicted leaf
            events = KVEventLog(cache, fingerprint, hasher=hasher)
    kv = KVManager(
        cache,
        enable_cache=config.enable_cache,
        retention=retention,
        max_pinned_blocks=max_pinned_blocks,
        tiers=tiers,
        events=events,
        admission=admission,
        max_lease_blocks=int(cache.capacity_blocks * config.lease_fraction),
        lease_clock=config.lease_clock,
        copy_page=pool.copy_block,
    )
    return tiers, events, kv


def build_mirror(memory: str | int | None, model: LlamaModel) -> DecodeMirror | None:
    """The decode mirror within `memory` (default 512 MiB on the CPU, off elsewhere; 0: off)."""
    if memory is None:
        memory = DEFAULT_MIRROR_MEMORY if model.device.type == "cpu" else 0
    if memory == 0 or memory == "0":
        return None
    budget = parse_memory(memory)
    return DecodeMirror(model.config, model.dtype, model.device, budget, native=model.native)


def build_kernels(config: EngineConfig, model: LlamaModel, threads: int) -> KernelPlan:
    """Give the model's float32 products this machine's measured kernels for `threads` threads (or the fixed rules:
    `config.kernel_mode()`; runtime.model.kernel_tune). The measurement runs on this thread; its OpenMP team is
    released afterwards, as the engine does whenever the caller waits (runtime.native.openmp)."""
    from radixcache.runtime.model.kernel_tune import choose_kernels
    from radixcache.runtime.native.openmp import release_idle_team

    plan = choose_kernels(model, config.kernel_mode(), threads)
    if plan.source == "measured":
        release_idle_team()
    return plan


def weights_identity(model: Any) -> str:
    """What names the weights in the disk tier's fingerprint: a digest of the file or directory they come from, or
    of the weights themselves (and the norms' epsilon of their config) when they were built in code."""
    if isinstance(model, (str, os.PathLike)):
        from radixcache.runtime.loading import resolve_model_path

        return "file:" + file_digest(resolve_model_path(model))
    if isinstance(model, LlamaModel) and model.weights_id:
        return model.weights_id
    source = getattr(model, "source", None)
    if isinstance(source, str) and os.path.exists(source):
        return "file:" + file_digest(source)
    weights = getattr(model, "weights", None)
    if isinstance(weights, dict) and weights:
        # A file's digest covers its config; here the norms' epsilon, which shapes every K/V, is named beside them
        return "tensors:" + weights_digest(weights) + f",rms_norm_eps={model.config.rms_norm_eps!r}"
    raise ValueError(
        "cache_dir needs to fingerprint the weights: pass a model path or a loaded model (with .source or .weights), "
        "not a bare LlamaModel"
    )


def activations_id(model: Any) -> str | None:
    """What a fingerprint records of a model's GGUF block kernels (`kv_fingerprint`'s `activations`): their mode, None
    for other formats; under "auto" also the kernel each block matrix chose. "auto" times the kernels once per
    process, so a restart may choose int8 where the last process chose float, whose rounding changes the K/V: pages
    are shared only between processes that chose alike (the choice is made here, before the first pass)."""
    mode = getattr(model, "gguf_activations", None)
    if mode != "auto":
        return mode
    linears = [linear for layer in model.layers for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    return "auto:" + ",".join(linear.kernel_for(1) for linear in linears if isinstance(linear, BlockLinear))
