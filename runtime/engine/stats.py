"""The engine's figures: totals since construction and the cache's gauges now (`Engine.stats`), and the gauges
`Engine.check` returns after checking the cache's invariants. Read on the caller's thread (stats) or on the loop
thread between two steps (check)."""

from __future__ import annotations

from dataclasses import dataclass

from radixcache import CacheStats, RadixCache
from radixcache.runtime.engine.output import Totals
from radixcache.runtime.engine.scheduler import Scheduler
from radixcache.runtime.engine.threads import ThreadController
from radixcache.runtime.kv.manager import KVManager
from radixcache.runtime.kv.tier.coordinator import KVTiers, TierCounters


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Engine totals since construction, plus the cache's block gauges now."""

    requests: int  # results delivered: finished, timed out or cancelled (a failed request raises instead)
    prompt_tokens: int  # of the requests admitted at least once
    cached_tokens: int  # prompt tokens found in the cache at their first admission
    prefill_tokens: int  # prompt tokens computed (prompt_tokens - cached_tokens)
    generated_tokens: int
    capacity_blocks: int  # the pool's pages, and below, where they are now
    free_blocks: int
    evictable_blocks: int
    locked_blocks: int
    cache: CacheStats  # the tree's own counters
    running: int = 0  # prefilling or decoding now
    waiting: int = 0  # queued or preempted
    preemptions: int = 0
    recomputed_tokens: int = 0  # positions computed again after preemptions (never hits)
    pinned_blocks: int = 0
    steps: int = 0  # scheduler steps (each runs at most one forward pass)
    tiers: TierCounters | None = None  # per-tier hits and page moves, with a host tier or a cache directory
    admission_declined_pages: int = 0  # computed full pages the admission policy kept out of the tree (freed)
    leases: int = 0  # leases held now (runtime.kv.leases), those past their deadline until the next check
    threads: int = 0  # torch threads the engine's steps run on now (runtime.engine.threads: fewer while busy)
    thread_changes: int = 0  # times the thread controller changed that count
    # 1 while the disk tier (a cache directory) accepts writes, 0 while a full disk pauses them or once it turned itself
    # off (an unwritable directory: engine.tiers.disk.disabled_reason says why; it still serves the pages on disk);
    # None without one
    disk_tier_up: int | None = None

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the cache / prompt tokens (recomputation after preemption is not a hit)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def engine_stats(
    t: Totals, s: Scheduler, kv: KVManager, tiers: KVTiers | None, threads: ThreadController | None = None
) -> EngineStats:
    """The figures now: the output processor's totals `t`, the scheduler's queues, the KV manager's cache, the
    thread controller's count."""
    c = kv.cache
    return EngineStats(
        requests=t.requests,
        prompt_tokens=t.prompt,
        cached_tokens=t.cached,
        prefill_tokens=t.prefill,
        generated_tokens=t.generated,
        capacity_blocks=c.capacity_blocks,
        free_blocks=c.free_blocks,
        evictable_blocks=c.evictable_blocks,
        locked_blocks=c.locked_blocks,
        cache=c.stats,
        running=len(s.prefilling) + len(s.decoding),
        waiting=len(s.waiting),
        preemptions=s.preemptions,
        recomputed_tokens=t.recomputed,
        pinned_blocks=kv.pins.blocks,
        steps=s.steps,
        tiers=None if tiers is None else tiers.counters,
        admission_declined_pages=kv.declined_pages,
        leases=len(kv.leases),
        threads=0 if threads is None else threads.threads,
        thread_changes=0 if threads is None else threads.changes,
        disk_tier_up=None if tiers is None or tiers.disk is None else int(tiers.disk.enabled),
    )


def checked_gauges(cache: RadixCache, s: Scheduler, kv: KVManager, tiers: KVTiers | None) -> dict[str, int]:
    """Check the cache's (and the tiers') invariants, then return the block gauges and queue lengths. Raises the
    cache's InvariantError if one is broken (a bug). On the loop thread, between two steps."""
    cache.check_invariants()
    if tiers is not None:
        tiers.check()
    return {
        "capacity_blocks": cache.capacity_blocks,
        "free_blocks": cache.free_blocks,
        "evictable_blocks": cache.evictable_blocks,
        "locked_blocks": cache.locked_blocks,
        "held_blocks": cache.held_blocks,
        "pinned_blocks": kv.pins.blocks,
        "leases": len(kv.leases),
        "leased_blocks": kv.leases.blocks,
        "running": len(s.prefilling) + len(s.decoding),
        "waiting": len(s.waiting),
    }
