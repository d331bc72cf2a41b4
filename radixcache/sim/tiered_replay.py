"""The replay through a device RadixCache with host and disk tiers under it (`TieredReplay`), and its modelled TTFT.

Its configuration and cost model are radixcache.sim.tiers's; the tiers themselves are radixcache.tier's.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Hashable

from radixcache.cache import RadixCache
from radixcache.errors import RadixCacheError
from radixcache.page_hash import PageChain
from radixcache.policy.base import EvictionPolicy
from radixcache.policy.registry import make_policy
from radixcache.sim.replay_common import (
    OneCacheReplay,
    Replayable,
    advance_to_arrival,
    fit_request,
    holds_engine_tail,
    prompt_blocks,
    replay_figures,
    request_tokens,
    shared_early,
)
from radixcache.sim.results import ORACLE_POLICIES, SimResult
from radixcache.sim.tiers import TIERS, LatencyDigest, TierConfig, TierResult, build_tiers
from radixcache.trace.workload import SimRequest


class TieredReplay(OneCacheReplay):
    """One replay through a TieredCache (radixcache.tier): the device RadixCache of `capacity_blocks`, with the
    host and disk tiers of `tiers` under it, fed like CacheReplay.

    Each request: the device match, then the pages after it that the host holds, then those after them that the
    disk holds (TieredCache.match). The device match is locked and counted as CacheReplay counts it; the host and
    disk pages are loaded (hits of their tier) when loading is cheaper than recomputing them (TierCosts.loads), and
    otherwise recomputed (misses). The request then takes device blocks for all its pages past the device match,
    exactly as CacheReplay does (the loaded pages land in some of them), with the host pages it loads locked while
    the allocation evicts (a write-back may store into the host); then the pages it found refresh their host and
    disk copies, the run's head last, as the engine's device hits do. When it finishes its pages are inserted into the
    tree, and the pages the tree adopts are handed to `TieredCache.adopted`: copied to the host under write_through,
    and stored in the disk (every adopted page is written through to the disk). Device evictions reach the host
    through the tree's eviction listener (write_back copies them there; the other policies refresh their copies).

    The device's contents do not depend on the tiers (a request's pages go to the device whether they were loaded
    or recomputed, and the tiers never change the tree), so the device hits are those of the same cache without
    tiers, and with neither a host nor a disk every figure is CacheReplay's, to the block. Each request's modelled
    TTFT (radixcache.sim.tiers) goes into a LatencyDigest, beside the same model with the device alone (its
    device hits only) and with no cache at all.

    Tier keys (`key`): by default a hash trace's pages are keyed by their hash ids ("hash-id": chained ids name their
    whole prefix), and a token trace's by radixcache.page_hash's chained blake2b hashes ("blake2b").
    """

    def __init__(
        self,
        workload: Replayable,
        capacity_blocks: int,
        policy: str | EvictionPolicy = "lru",
        *,
        tiers: TierConfig | None = None,
        concurrency: int = 1,
        check: bool = False,
        windows: int = 20,
        key: str | None = None,
        honor_timestamps: bool = False,
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise RadixCacheError(f"concurrency must be a positive int, got {concurrency!r}")
        if isinstance(policy, str) and policy in ORACLE_POLICIES:
            raise RadixCacheError(f"the offline policy {policy!r} replays the device cache alone, without tiers")
        config = tiers if tiers is not None else TierConfig()
        self.cache = RadixCache(capacity_blocks, page_size=workload.page_size, policy=make_policy(policy))
        self.expect = getattr(self.cache.policy, "expect", None)  # a policy that learns from output lengths (reuse)
        if key is None:
            key = "hash-id" if workload.kind == "hash" and workload.page_size == 1 else "blake2b"
        self.config, self.key = config, key
        self.tiered, self.host, self.disk = build_tiers(self.cache, config, key)
        self.any_tier = self.host is not None or self.disk is not None
        super().__init__(workload, capacity_blocks, concurrency, check, windows, honor_timestamps)
        costs, page_tokens = config.costs, workload.block_tokens
        self.prefill_s = costs.prefill_s_per_token
        self.host_s = costs.load_s_per_page("host", page_tokens)
        self.disk_s = costs.load_s_per_page("disk", page_tokens)
        self.load_host = self.host is not None and costs.loads("host", page_tokens)
        self.load_disk = self.disk is not None and costs.loads("disk", page_tokens)
        self.hits = [0, 0, 0]  # prompt tokens served by the device, the host, the disk
        self.loaded = [0, 0]  # pages loaded from the host, the disk
        self.ttft = LatencyDigest()
        self.ttft_device_only = LatencyDigest()
        self.ttft_no_cache = LatencyDigest()

    def feed(self, index: int, request: SimRequest) -> None:
        started = time.perf_counter()
        cache, p = self.cache, self.page_size
        for item in self.inflight.due(request.timestamp_ms):
            self._finish(item)
        if self.honor_timestamps:
            advance_to_arrival(cache, request)
        full, prompt = request_tokens(request)
        chain = self.tiered.chain(request.namespace) if self.any_tier else None
        found = self.tiered.match(prompt, request.namespace, chain)
        match = found.device
        cache.lock(match.node)
        matched_pages = len(match.blocks)
        full, need, room, cut = fit_request(cache, full, matched_pages)
        self.oversized += cut
        # Pages loaded land in the request's new blocks, so no more of them than it gets.
        host_found = found.host_pages
        host_pages = min(host_found, need) if self.load_host else 0
        disk_pages = max(0, min(found.lower_pages, need - host_found)) if self.load_disk else 0
        # A request an engine recorded also held the page it was still writing, as in CacheReplay (holds_tail).
        tail = holds_engine_tail(request, full, p) and need < room
        if host_pages:  # being copied up: a write-back into the host during the allocation must not evict them
            reading = list(dict.fromkeys(found.hashes[matched_pages : matched_pages + host_pages]))
            self.host.lock(reading)  # type: ignore[union-attr]
            new = cache.allocate(need + tail)
            self.host.unlock(reading)  # type: ignore[union-attr]
        else:
            new = cache.allocate(need + tail)
        held = new[-1:] if tail else None
        if tail:
            new = new[:-1]
        if self.any_tier:
            # As the engine does (runtime/kv/manager.py): the tiers' LRUs see their own reads only, so a prefix every
            # request hits on the device would be the first page they evict. The pages found (device, then loaded)
            # refresh their copies, the run's head last; only the hashes the match computed (none when the device
            # held every whole page of the prompt, which the engine does not hash at admission).
            found_run = found.hashes[: matched_pages + host_pages + disk_pages]
            for tier in (self.host, self.disk):
                if tier is not None:
                    tier.touch(found_run)
        blocks, node = match.blocks + new, match.node
        early = shared_early(request, len(full) // p, p)
        if early > matched_pages:  # its prompt's pages go into the tree (and the tiers) now, pinned until it ends
            self._adopt(full[: early * p], blocks[:early], request.namespace, chain)
            pinned = cache.lock_prefix(full, early * p, namespace=request.namespace)  # all cached: never None
            if pinned is not None:
                cache.unlock(match.node)
                node = pinned
        output_tokens = request.output_tokens if request.output_tokens is not None else len(request.output)
        self.inflight.add((node, full, blocks, request.namespace, chain, output_tokens, held), request.finish_ms)
        tokens = request.prompt_tokens
        page_tokens = p * request.unit
        device_hit = min(matched_pages * page_tokens, tokens)
        host_hit = min((matched_pages + host_pages) * page_tokens, tokens) - device_hit
        disk_start = min((matched_pages + host_found) * page_tokens, tokens)
        disk_hit = min((matched_pages + host_found + disk_pages) * page_tokens, tokens) - disk_start
        hit = device_hit + host_hit + disk_hit
        hits = self.hits
        hits[0] += device_hit
        hits[1] += host_hit
        hits[2] += disk_hit
        self.loaded[0] += host_pages
        self.loaded[1] += disk_pages
        prefill_s = self.prefill_s
        self.ttft.add(prefill_s * (tokens - hit) + self.host_s * host_pages + self.disk_s * disk_pages)
        self.ttft_device_only.add(prefill_s * (tokens - device_hit))
        self.ttft_no_cache.add(prefill_s * tokens)
        self.prompt_blocks += prompt_blocks(request, p)
        self.hit_blocks += matched_pages + host_pages + disk_pages
        self.timeline.add(request.timestamp_ms, tokens, hit)
        if self.check:
            self.check_invariants()
        self.seconds += time.perf_counter() - started

    def _finish(self, item: tuple) -> None:
        """Insert a finished request, hand the pages the tree adopted to the tiers, and unlock its match."""
        node, full, blocks, namespace, chain, output_tokens, held = item
        cache, p = self.cache, self.page_size
        if held is not None:
            cache.free(held)
        if self.expect is not None:  # as the device alone's replay tells it (CacheReplay), and takes it back after
            self.expect(output_tokens)
        self._adopt(full, blocks, namespace, chain)
        if self.expect is not None:
            self.expect(None)
        if len(full) % p:
            cache.free(blocks[-1:])  # the unaligned tail page never enters the tree
        cache.unlock(node)

    def _adopt(self, full: array, blocks: array, namespace: Hashable, chain: PageChain | None) -> None:
        """Insert `full`'s pages and hand those the tree adopted to the tiers."""
        p = self.page_size
        cached = self.cache.insert(full, blocks, namespace=namespace) // p
        pages = len(full) // p
        if chain is not None and pages > cached:
            self.tiered.adopted(chain.upto(full, pages)[cached:], blocks[cached:pages], full[cached * p : pages * p])

    def check_invariants(self) -> None:
        self.tiered.check_invariants()
        if self.disk is not None:
            self.disk.check_invariants()

    def close(self) -> None:
        for item in self.inflight.drain():
            self._finish(item)
        if self.check:
            self.check_invariants()

    def result(self) -> SimResult:
        config = self.config
        present = config.tiers
        stats = {t.name: t.stats for t in (self.host, self.disk) if t is not None}
        tiers = TierResult(
            write_policy=config.write_policy,
            host_capacity_blocks=config.host_capacity_blocks,
            disk_capacity_blocks=config.disk_capacity_blocks,
            costs=config.costs,
            page_tokens=self.block_tokens,
            prompt_tokens=self.timeline.prompt_tokens,
            hit_tokens={tier: n for tier, n in zip(TIERS, self.hits, strict=True) if tier in present},
            loaded_blocks={tier: n for tier, n in zip(TIERS[1:], self.loaded, strict=True) if tier in present},
            tier_stats=stats,
            ttft=self.ttft.summary(),
            ttft_device_only=self.ttft_device_only.summary(),
            ttft_no_cache=self.ttft_no_cache.summary(),
            key=self.key,
        )
        return replay_figures(
            self, self.cache.policy.name, self.capacity_blocks, self.cache.stats.evicted_blocks, self.oversized, tiers
        )
