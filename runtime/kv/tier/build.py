"""The engine's tiers (kv.tier.coordinator.KVTiers) built from its options."""

from __future__ import annotations

import torch

from radixcache import RadixCache
from radixcache.runtime.kv.pool import KVPool, check_fits, parse_memory
from radixcache.runtime.kv.tier.coordinator import KVTiers
from radixcache.runtime.kv.tier.disk_format import MAX_HASH_BYTES, encode_page, page_meta
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.host_pool import HostKVPool
from radixcache.runtime.kv.tier.prefetch import (
    DEFAULT_PAGES_PER_STEP,
    DEFAULT_PREFETCH_POLICY,
    DEFAULT_PREFETCH_TIMEOUT_MS,
)


def build_tiers(
    cache: RadixCache,
    pool: KVPool,
    *,
    host_kv_memory: str | int | None,
    cache_dir: str | None,
    cache_dir_size: str | int,
    write_policy: str,
    fingerprint: str,
    load_back: str = "auto",
    prefetch_policy: str = DEFAULT_PREFETCH_POLICY,
    prefetch_timeout_ms: float = DEFAULT_PREFETCH_TIMEOUT_MS,
    prefetch_pages_per_step: int = DEFAULT_PAGES_PER_STEP,
) -> KVTiers | None:
    """The engine's tiers from its options, or None when neither a host budget nor a cache directory is given."""
    if host_kv_memory is None and cache_dir is None:
        return None
    host_slots = 0
    if host_kv_memory is not None:
        page = HostKVPool.page_bytes(pool)
        host_slots = parse_memory(host_kv_memory) // page
        if host_slots < 1:
            raise ValueError(f"host_kv_memory {host_kv_memory!r} is smaller than one page ({page} bytes)")
        check_fits(host_slots * page, torch.device("cpu"), f"host_kv_memory={host_kv_memory!r}")
    disk = None
    if cache_dir is not None:
        max_bytes, page = parse_memory(cache_dir_size), page_file_bytes(pool, fingerprint)
        if max_bytes < page:  # every write would be refused, silently: a disk tier that never holds a page
            raise ValueError(f"cache_dir_size {cache_dir_size!r} is smaller than one page's file ({page} bytes)")
        disk = DiskStore(cache_dir, max_bytes=max_bytes, fingerprint=fingerprint)
    return KVTiers(
        cache,
        pool,
        host_slots=host_slots,
        disk=disk,
        write_policy=write_policy,
        fingerprint=fingerprint,
        load_back=load_back,
        prefetch_policy=prefetch_policy,
        prefetch_timeout_ms=prefetch_timeout_ms,
        prefetch_pages_per_step=prefetch_pages_per_step,
    )


def page_file_bytes(pool: KVPool, fingerprint: str) -> int:
    """The most bytes one page's file takes (its KV, and a header with the widest hash and token ids)."""
    widest = [2**62] * pool.page_size
    payload = bytes(HostKVPool.page_bytes(pool))
    return encode_page(bytes(MAX_HASH_BYTES), fingerprint, widest, payload, page_meta(pool)).size
