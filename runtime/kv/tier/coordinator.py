"""The tiers under the device pool, for the KV manager: find a prompt's pages in the host and on disk, load back the
ones cheaper to load than to recompute, and send adopted pages down.

The policy (where pages are, when they move) is radixcache.tier.TieredCache; this module moves the bytes: host
pages in a HostKVPool, disk pages in a DiskStore, device pages in the KVPool. Everything runs on the engine loop
thread except the disk store's writer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from radixcache import RadixCache
from radixcache.page_hash import PageChain
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.kv.tier.copy_sync import CopyEvent, PendingUnlocks
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.host_pool import HostKVPool
from radixcache.tier.page_tier import PageTier
from radixcache.tier.tiered_cache import TieredCache, TierMatch

_EMA = 0.2  # weight of the newest measurement in the cost averages
log = logging.getLogger("radixcache.disk")


@dataclass(frozen=True, slots=True)
class TierCounters:
    """Per-tier counters since the engine started. *_hit_tokens: prompt tokens of fresh requests served from each
    tier (device: matched in the tree; host, disk: loaded back). *_loaded_pages: pages copied up (resumptions too).
    declined_pages: pages found below the device but recomputed because that was cheaper. disk_failed_reads: pages
    listed on disk whose file failed its checks (deleted, recomputed). host_saved_pages: pages copied to the host.
    host_failed_copies: copies to or from the host that raised (pages not cached there, or recomputed).
    disk_queued_pages / disk_dropped_pages: page writes handed to the disk writer, or dropped (queue full,
    tier disabled)."""

    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    disk_hit_tokens: int = 0
    host_loaded_pages: int = 0
    disk_loaded_pages: int = 0
    declined_pages: int = 0
    disk_failed_reads: int = 0
    host_saved_pages: int = 0
    host_failed_copies: int = 0
    disk_queued_pages: int = 0
    disk_dropped_pages: int = 0


class LoadCosts:
    """Measured costs, as moving averages: seconds of prefill per token, seconds to load a page from each tier.

    A tier's pages are loaded when `pages * load_per_page < pages * page_size * prefill_per_token`. Until both sides
    are measured, loading is assumed cheaper (the first load measures it). `mode` "always" or "never" overrides the
    comparison (benchmarks and tests that need a fixed choice; "never" leaves the tiers to fill but not serve)."""

    MODES = ("auto", "always", "never")

    def __init__(self, mode: str = "auto") -> None:
        if mode not in self.MODES:
            raise ValueError(f"load_back must be one of {', '.join(self.MODES)}, got {mode!r}")
        self.mode = mode
        self.prefill_s_per_token: float | None = None
        self.load_s_per_page: dict[str, float] = {}

    def note_prefill(self, tokens: int, seconds: float) -> None:
        if tokens > 0:
            self.prefill_s_per_token = _ema(self.prefill_s_per_token, seconds / tokens)

    def note_load(self, tier: str, pages: int, seconds: float) -> None:
        if pages > 0:
            self.load_s_per_page[tier] = _ema(self.load_s_per_page.get(tier), seconds / pages)

    def worth_loading(self, tier: str, page_size: int) -> bool:
        if self.mode != "auto":
            return self.mode == "always"
        load, prefill = self.load_s_per_page.get(tier), self.prefill_s_per_token
        return load is None or prefill is None or load < page_size * prefill


class KVTiers:
    """The host tier (`host_slots` pages, 0 for none) and the disk store (None for none) under one device pool."""

    def __init__(
        self,
        cache: RadixCache,
        pool: KVPool,
        *,
        host_slots: int = 0,
        disk: DiskStore | None = None,
        write_policy: str = "write_through",
        fingerprint: str = "",
        load_back: str = "auto",
    ) -> None:
        self.pool = pool
        self.page_size = pool.page_size
        self.host_pool = HostKVPool(pool, host_slots) if host_slots else None
        host = PageTier(host_slots, name="host") if host_slots else None
        self.disk = disk
        self.tiered = TieredCache(
            cache,
            host=host,
            lower=disk,
            write_policy=write_policy,
            fingerprint=fingerprint,
            copy_to_host=self._copy_to_host if host is not None else None,
            write_lower=self._write_disk if disk is not None else None,
        )
        self.costs = LoadCosts(load_back)
        self._counts = dict.fromkeys(TierCounters.__slots__, 0)
        self._pending = PendingUnlocks()  # host pages that CUDA loads still read

    @property
    def host(self) -> PageTier | None:
        return self.tiered.host

    def chain(self, namespace: Hashable) -> PageChain:
        return self.tiered.chain(namespace)

    def match(self, tokens: Sequence[int], namespace: Hashable, chain: PageChain) -> TierMatch:
        self.poll()
        return self.tiered.match(tokens, namespace, chain)

    # ------------------------------------------------------------------ loading back

    def plan(self, match: TierMatch) -> tuple[int, int]:
        """How many host pages, then disk pages, after the device match to load (the rest is recomputed)."""
        host = match.host_pages if self.costs.worth_loading("host", self.page_size) else 0
        disk = match.lower_pages if host == match.host_pages and self.costs.worth_loading("disk", self.page_size) else 0
        self._counts["declined_pages"] += match.host_pages + match.lower_pages - host - disk
        return host, disk

    def lock_host(self, match: TierMatch, host_pages: int) -> list[bytes]:
        """Lock the host pages to load, so that evictions while blocks are allocated keep them."""
        d = match.device_pages
        hashes = match.hashes[d : d + host_pages]
        if hashes:
            assert self.host is not None
            self.host.lock(hashes)
        return hashes

    def unlock_host(self, hashes: list[bytes], event: CopyEvent | None = None) -> None:
        if not hashes:
            return
        assert self.host is not None
        if event is None:
            self.host.unlock(hashes)
        else:  # the copy still reads the host slots: unlock once it is done (poll)
            self._pending.add(event, hashes)

    def load(
        self, match: TierMatch, host_hashes: list[bytes], disk_pages: int, tokens: Sequence[int], blocks: Sequence[int]
    ) -> int:
        """Copy the locked host pages, then up to `disk_pages` disk pages, into `blocks` (the request's new blocks
        after its device match, in order). Returns the pages loaded: all the host pages, then the disk pages up to
        the first that fails its checks; 0 when the host copy raises (the whole rest is then recomputed, over
        whatever the copy wrote). Unlocks the host pages (once their copy is done)."""
        p = self.page_size
        loaded = len(host_hashes)
        event = None
        try:
            if host_hashes:
                assert self.host is not None and self.host_pool is not None
                t0 = time.perf_counter()
                event = self.host_pool.load(self.pool, self.host.slots(host_hashes), blocks[:loaded])
                self.costs.note_load("host", loaded, time.perf_counter() - t0)
                self._counts["host_loaded_pages"] += loaded
        except Exception:
            log.exception("loading %d page(s) from the host tier failed; recomputing them", loaded)
            self._counts["host_failed_copies"] += 1
            return 0
        finally:
            self.unlock_host(host_hashes, event)
        if disk_pages and self.disk is not None:
            start = match.device_pages + loaded
            t0 = time.perf_counter()
            got = 0
            for i in range(disk_pages):
                page = start + i
                if not self._read_disk(match.hashes[page], tokens[page * p : (page + 1) * p], blocks[loaded + i]):
                    self._counts["disk_failed_reads"] += 1
                    break
                got += 1
            self.costs.note_load("disk", max(got, 1), time.perf_counter() - t0)
            self._counts["disk_loaded_pages"] += got
            loaded += got
        return loaded

    def count_hits(self, device_tokens: int, host_tokens: int, disk_tokens: int) -> None:
        c = self._counts
        c["device_hit_tokens"] += device_tokens
        c["host_hit_tokens"] += host_tokens
        c["disk_hit_tokens"] += disk_tokens

    def _read_disk(self, page_hash: bytes, page_tokens: Sequence[int], block: int) -> bool:
        """Copy one disk page into `block`; False when it is absent, fails a check, or anything raises (the page
        and the rest of the prompt are then recomputed, over whatever this wrote into the block)."""
        try:
            return self._read_disk_page(page_hash, page_tokens, block)
        except Exception:
            log.exception("disk KV cache: loading a page failed; recomputing it")
            return False

    def _read_disk_page(self, page_hash: bytes, page_tokens: Sequence[int], block: int) -> bool:
        assert self.disk is not None
        got = self.disk.read(page_hash, page_tokens)
        if got is None:
            return False
        payload, meta = got
        pool = self.pool
        shape = (pool.num_layers, 2, pool.page_size, pool.kv_heads, pool.head_dim)
        if meta.get("dtype") != str(pool.dtype) or tuple(meta.get("shape", ())) != shape:
            return False  # cannot happen under one fingerprint; never use bytes of another shape
        page = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(pool.dtype).view(shape)
        pool.kv[:, :, block].copy_(page.to(pool.device))
        return True

    # ------------------------------------------------------------------ pages going down

    def adopted(
        self, chain: PageChain, tokens: Sequence[int], first_page: int, last_page: int, blocks: Sequence[int]
    ) -> None:
        """The tree adopted the pages `first_page .. last_page` of a request (`blocks`: their device blocks)."""
        if last_page <= first_page:
            return
        p = self.page_size
        hashes = chain.upto(tokens, last_page)[first_page:last_page]
        self.tiered.adopted(hashes, blocks, tokens[first_page * p : last_page * p])

    def _copy_to_host(self, blocks: Sequence[int], slots: list[int]) -> None:
        assert self.host_pool is not None
        try:
            self.host_pool.save(self.pool, blocks, slots)
        except Exception:
            self._counts["host_failed_copies"] += 1
            raise  # TieredCache discards the pages: their slots map to no hash
        self._counts["host_saved_pages"] += len(blocks)

    def _write_disk(self, hashes: list[bytes], blocks: Sequence[int], tokens: Sequence[int]) -> None:
        """Hand adopted pages to the disk writer. Never raises: a failure drops the pages (counted), the request
        that adopted them goes on."""
        try:
            self._queue_disk_writes(hashes, blocks, tokens)
        except Exception:
            self._counts["disk_dropped_pages"] += len(hashes)
            log.exception("disk KV cache: queueing %d page(s) failed; not written", len(hashes))

    def _queue_disk_writes(self, hashes: list[bytes], blocks: Sequence[int], tokens: Sequence[int]) -> None:
        disk = self.disk
        assert disk is not None
        if not disk.enabled:
            return
        todo = [i for i, h in enumerate(hashes) if disk.count_prefix([h]) == 0]
        if not todo:
            return
        pool, p = self.pool, self.page_size
        pages = pool.kv.index_select(2, torch.tensor([blocks[i] for i in todo], device=pool.device)).to("cpu")
        meta = {"dtype": str(pool.dtype), "shape": [pool.num_layers, 2, p, pool.kv_heads, pool.head_dim]}
        for j, i in enumerate(todo):
            payload = pages[:, :, j].contiguous().view(torch.uint8).numpy().tobytes()
            queued = disk.put(hashes[i], tokens[i * p : (i + 1) * p], payload, meta)
            self._counts["disk_queued_pages" if queued else "disk_dropped_pages"] += 1

    # ------------------------------------------------------------------ upkeep

    def note_prefill(self, tokens: int, seconds: float) -> None:
        self.costs.note_prefill(tokens, seconds)

    def poll(self) -> None:
        """Unlock host pages whose CUDA copies have finished."""
        if self._pending:
            assert self.host is not None
            for hashes in self._pending.finished():
                self.host.unlock(hashes)

    @property
    def counters(self) -> TierCounters:
        return TierCounters(**self._counts)

    def close(self, timeout: float | None = 30.0) -> None:
        """Finish the pending disk writes (up to `timeout`) and stop the writer."""
        for hashes in self._pending.drain():
            assert self.host is not None
            self.host.unlock(hashes)
        if self.disk is not None:
            self.disk.close(timeout=timeout)

    def check(self) -> None:
        self.tiered.check_invariants()


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EMA) * old + _EMA * new


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
) -> KVTiers | None:
    """The engine's tiers from its options, or None when neither a host budget nor a cache directory is given."""
    from radixcache.runtime.kv.pool import parse_memory

    if host_kv_memory is None and cache_dir is None:
        return None
    host_slots = 0
    if host_kv_memory is not None:
        page = HostKVPool.page_bytes(pool)
        host_slots = parse_memory(host_kv_memory) // page
        if host_slots < 1:
            raise ValueError(f"host_kv_memory {host_kv_memory!r} is smaller than one page ({page} bytes)")
    disk = None
    if cache_dir is not None:
        disk = DiskStore(cache_dir, max_bytes=parse_memory(cache_dir_size), fingerprint=fingerprint)
    return KVTiers(
        cache,
        pool,
        host_slots=host_slots,
        disk=disk,
        write_policy=write_policy,
        fingerprint=fingerprint,
        load_back=load_back,
    )
