"""The tiers under the device pool, for the KV manager: find a prompt's pages in the host and on disk, load back the
ones cheaper to load than to recompute, and send adopted pages down.

The policy (where pages are, when they move) is radixcache.tier.TieredCache; this module moves the bytes: host
pages in a HostKVPool, disk pages in a DiskStore, device pages in the KVPool. Everything runs on the engine loop
thread except the disk store's writer and the prefetch readers (kv.tier.prefetch): a request the scheduler will
admit has its disk pages read ahead by `prefetch`, and its load takes them from there in one batched copy; its
host pages are copied in one batched copy at admission (they are in memory already), and stay locked from the
prefetch's start (so that the disk run after them stays usable) until that copy is done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Sequence

from radixcache import RadixCache
from radixcache.page_hash import PageChain
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.kv.tier.copy_sync import CopyEvent, PendingUnlocks
from radixcache.runtime.kv.tier.disk_queue import queue_disk_writes
from radixcache.runtime.kv.tier.disk_stamps import Hashes
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.host_pool import HostKVPool
from radixcache.runtime.kv.tier.host_recency import HostPageTier, shared
from radixcache.runtime.kv.tier.layered_load import LayeredLoad
from radixcache.runtime.kv.tier.load_costs import LoadCosts, TierCounters, TierTally
from radixcache.runtime.kv.tier.prefetch import (
    DEFAULT_PAGES_PER_STEP,
    DEFAULT_PREFETCH_POLICY,
    DEFAULT_PREFETCH_TIMEOUT_MS,
    PrefetchReader,
)
from radixcache.runtime.kv.tier.prefetch_jobs import PrefetchJobs
from radixcache.runtime.kv.tier.staging import DEFAULT_MAX_BYTES
from radixcache.runtime.weak import weak_method
from radixcache.tier.tiered_cache import TieredCache, TierMatch

__all__ = ["KVTiers", "LoadCosts", "TierCounters"]  # LoadCosts, TierCounters: from load_costs
log = logging.getLogger("radixcache.disk")


def staging_bound(pool: KVPool) -> int:
    """The bytes of staging memory a disk tier's prefetches may hold at once: the pool's pages (no load copies more
    into it), at most `DEFAULT_MAX_BYTES`. Whatever the host tier's size (docs/tiers.md, "Bounded, in bytes")."""
    return min(DEFAULT_MAX_BYTES, pool.num_blocks * HostKVPool.page_bytes(pool))


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
        prefetch_policy: str = DEFAULT_PREFETCH_POLICY,
        prefetch_timeout_ms: float = DEFAULT_PREFETCH_TIMEOUT_MS,
        prefetch_pages_per_step: int = DEFAULT_PAGES_PER_STEP,
    ) -> None:
        self.pool = pool
        self.page_size = pool.page_size
        self.host_pool = HostKVPool(pool, host_slots) if host_slots else None
        host = HostPageTier(host_slots, name="host") if host_slots else None
        self.disk = disk
        self.tiered = TieredCache(
            cache,
            host=host,
            lower=disk,
            write_policy=write_policy,
            fingerprint=fingerprint,
            # weakly: these tiers hold `tiered`, and a cycle back would keep the KV pools until a full collection
            copy_to_host=weak_method(self._copy_to_host) if host is not None else None,
        )  # no write_lower: `adopted` queues the disk writes itself, each page with its parent
        self.costs = LoadCosts(load_back, self.page_size)
        self._counts = TierTally()
        self._pending: PendingUnlocks[tuple[list[bytes], list[bytes]]] = PendingUnlocks()  # what CUDA loads read
        self.reader = (
            PrefetchReader(
                disk,
                pool,
                policy=prefetch_policy,
                timeout_ms=prefetch_timeout_ms,
                pages_per_step=prefetch_pages_per_step,
                # the most one load can take (the pool's pages), within a fixed budget (kv.tier.staging); not the host
                # tier's size: a small host tier cut the disk loads an engine without one took whole
                max_staged_bytes=staging_bound(pool),
            )
            if disk is not None
            else None
        )
        # each waiting request's prefetch, from the first `prefetch` until its load or `cancel_prefetch`
        self.jobs = PrefetchJobs(self.tiered, self.reader, disk, pool, self.costs, self._counts)

    @property
    def host(self) -> HostPageTier | None:
        return self.tiered.host  # type: ignore[return-value]  # the HostPageTier made above

    def chain(self, namespace: Hashable) -> PageChain:
        return self.tiered.chain(namespace)

    def match(self, tokens: Sequence[int], namespace: Hashable, chain: PageChain) -> TierMatch:
        self.poll()
        return self.tiered.match(tokens, namespace, chain)

    # ------------------------------------------------------------------ loading back

    def plan(self, match: TierMatch) -> tuple[int, int]:
        """How many host pages, then disk pages, after the device match to load (the rest is recomputed). Changes
        nothing: an admission that finds no room plans again at every step, so `load` counts the decision, once."""
        host = match.host_pages if not match.host_pages or self.costs.worth_loading("host") else 0
        chained = match.lower_pages and host == match.host_pages  # the disk run chains on every host page
        return host, match.lower_pages if chained and self.costs.worth_loading("disk") else 0

    def _count_plan(self, match: TierMatch, host: int, disk: int) -> None:
        """The admitted request's `plan`: its declines and probes (LoadCosts.choose), its declined pages."""
        if match.host_pages:
            self.costs.choose("host")
        if match.lower_pages and host == match.host_pages:
            self.costs.choose("disk")
        self._counts["declined_pages"] += match.host_pages + match.lower_pages - host - disk

    def lock_host(self, match: TierMatch, host_pages: int) -> list[bytes]:
        """Lock the host pages to load, so that evictions while blocks are allocated keep them."""
        d = match.device_pages
        hashes = match.hashes[d : d + host_pages]
        if hashes:
            assert self.host is not None
            self.host.lock(hashes)
        return hashes

    def unlock_host(self, hashes: list[bytes], event: CopyEvent | None = None, run: Sequence[bytes] = ()) -> None:
        """Unlock host pages locked for a load, now or (with the load's `event`) once its copy is done: `poll`. An
        unlock makes them the newest pages, so a deferred one refreshes `run` again (the pages from the prompt's
        head to them), or a run's head would be older than the pages loaded after it (the head goes last)."""
        if not hashes:
            return
        assert self.host is not None
        if event is None:
            self.host.unlock(hashes)
        else:
            self._pending.add(event, (hashes, list(run)))

    def load(
        self,
        match: TierMatch,
        host_hashes: list[bytes],
        disk_pages: int,
        tokens: Sequence[int],
        blocks: Sequence[int],
        rid: int | None = None,
        defer: bool = False,
    ) -> tuple[int, LayeredLoad | None]:
        """Copy the locked host pages, then up to `disk_pages` disk pages, into `blocks` (the request's new blocks
        after its device match, in order), each tier in one batched copy. Returns the pages loaded: all the host
        pages, then the disk pages up to the first that failed its checks; 0 when the host copy raises (the whole
        rest is then recomputed, over whatever the copy wrote). Unlocks the host pages (once their copy is done).
        The disk pages come from request `rid`'s prefetch when it has one (a page not read by now is recomputed:
        nothing is read here); a caller that never prefetched (`rid` unknown) reads them here. With `defer`, the
        disk pages are not copied yet: the LayeredLoad returned copies them layer by layer (kv.tier.layered_load)."""
        self._count_plan(match, len(host_hashes), disk_pages)
        prefetched, job = self.jobs.pop(rid)
        later: list[LayeredLoad] = []  # the deferred copy, which then owns the job
        try:
            loaded = self._load_host(host_hashes, blocks, match.hashes[: match.device_pages + len(host_hashes)])
            if loaded is None:
                return 0, None
            if disk_pages and self.reader is not None and (job is not None or not prefetched):
                start = match.device_pages + loaded
                loaded += self.jobs.load_disk(
                    match, tokens, start, disk_pages, blocks[loaded:], job, later if defer else None
                )
            return loaded, later[0] if later else None
        finally:
            if job is not None and not later:
                self.jobs._end_job(job)
            elif job is not None:  # the disk copy is deferred: the host pages it chained on are not needed by then
                self.jobs._let_host_go(job)

    def _load_host(self, host_hashes: list[bytes], blocks: Sequence[int], run: Sequence[bytes]) -> int | None:
        """Copy the locked host pages into the first of `blocks` and unlock them (once the copy is done: `run`, as
        `unlock_host`); how many, or None when the copy raised (counted, logged: the caller recomputes everything
        after the device match)."""
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
            return None
        finally:
            self.unlock_host(host_hashes, event, run)
        return loaded

    def failed_deferred_load(self, pages: int, hit_tokens: int) -> None:
        """A deferred disk load (kv.tier.layered_load) whose copy raised: a failed read (TierTally)."""
        log.exception("disk KV cache: copying %d read page(s) into the pool by layers failed; recomputing", pages)
        self._counts.failed_deferred_load(pages, hit_tokens)

    def refresh(self, run: Hashes) -> None:
        """An admission found `run` (its hashes head first, or a function computing them: a prompt the device holds
        whole is not hashed at admission): the most recently used in the host tier and on disk, its first page last,
        so that their size limits take a run's later pages first. Neither tier sees a device hit otherwise. No
        hashing here: the host tier hashes it before its next use, unless the disk's writer thread has by then."""
        run = shared(run)
        if self.host is not None:
            self.host.touch_later(run)
        if self.disk is not None:
            self.disk.refresh(run)

    def count_hits(self, matched: int, device_pages: int, host_pages: int) -> None:
        """Count an admission's `matched` cached tokens by tier (TierTally.hits)."""
        self._counts.hits(matched, device_pages, host_pages, self.page_size)

    # ------------------------------------------------------------------ prefetch (kv.tier.prefetch_jobs)

    def prefetch(self, rid: int, tokens: Sequence[int], namespace: Hashable, chain: PageChain) -> bool:
        """Read request `rid`'s disk pages ahead; whether it may be admitted now (PrefetchJobs.prefetch)."""
        return self.jobs.prefetch(rid, tokens, namespace, chain)

    def pace_prefetch(self, decoding: bool, wait: float = 0.0) -> None:
        """Before each step: the readers' pace, and a wait when the loop has nothing to run (PrefetchJobs)."""
        self.jobs.pace_prefetch(decoding, wait)

    def wait_prefetch(self, timeout: float) -> None:
        """The loop has nothing to run: wait for a page or a deadline (PrefetchJobs.wait_prefetch)."""
        self.jobs.wait_prefetch(timeout)

    def cancel_prefetch(self, rid: int) -> None:
        """Request `rid` left, or will not be admitted: stop its reads, unlock its host pages (PrefetchJobs)."""
        self.jobs.cancel_prefetch(rid)

    # ------------------------------------------------------------------ pages going down

    def adopted(
        self, chain: PageChain, tokens: Sequence[int], first_page: int, last_page: int, blocks: Sequence[int]
    ) -> None:
        """The tree adopted the pages `first_page .. last_page` of a request (`blocks`: their device blocks). A request
        adopts its run over several commits (prefill chunks, each decode page), and the prompt's head must not end up
        older than the pages after it (a tier's size limit took it first): both tiers place each page just older than
        the run's page before it (PageTier.store's `older_than`, DiskStore.put's `parent`), O(1) a page; the run is
        refreshed when used (an admission, `refresh`), not at each commit (O(run) a page: quadratic in a decode)."""
        if last_page <= first_page:
            return
        p = self.page_size
        run = chain.upto(tokens, last_page)
        page_tokens = tokens[first_page * p : last_page * p]
        parent = run[first_page - 1] if first_page else None
        self.tiered.adopted(run[first_page:], blocks, page_tokens, parent)
        if self.disk is not None:
            self._write_disk(run[first_page:], blocks, page_tokens, parent)

    def _copy_to_host(self, blocks: Sequence[int], slots: list[int]) -> None:
        assert self.host_pool is not None
        try:
            self.host_pool.save(self.pool, blocks, slots)
        except Exception:
            self._counts["host_failed_copies"] += 1
            raise  # TieredCache discards the pages: their slots map to no hash
        self._counts["host_saved_pages"] += len(blocks)

    def _write_disk(
        self, hashes: list[bytes], blocks: Sequence[int], tokens: Sequence[int], parent: bytes | None
    ) -> None:
        """Hand adopted pages to the disk writer (`parent`: the run's page before them). Never raises: a failure drops
        the pages (counted), the request that adopted them goes on."""
        try:
            assert self.disk is not None
            queue_disk_writes(self.disk, self.pool, self._counts, hashes, blocks, tokens, parent)
        except Exception:
            self._counts["disk_dropped_pages"] += len(hashes)
            log.exception("disk KV cache: queueing %d page(s) failed; not written", len(hashes))

    # ------------------------------------------------------------------ upkeep

    def note_prefill(self, tokens: int, seconds: float) -> None:
        self.costs.note_prefill(tokens, seconds)

    def poll(self) -> None:
        """Unlock host pages whose CUDA copies have finished, and refresh their runs again (`unlock_host`)."""
        if self._pending:
            assert self.host is not None
            for hashes, run in self._pending.finished():
                self.host.unlock(hashes)
                self.host.touch(run)

    @property
    def counters(self) -> TierCounters:
        """The counts so far; disk_dropped_pages also the queued pages the disk's writer never wrote (its write failed:
        a full disk; the run's page before it was gone; discarded at a close or a clear)."""
        counts = dict(self._counts)
        if self.disk is not None:
            counts["disk_dropped_pages"] += self.disk.lost_writes
        return TierCounters(**counts)

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop the prefetch readers (a read that hangs is abandoned: kv.tier.prefetch's `close`), finish the
        pending disk writes (up to `timeout`) and stop the writer."""
        self.jobs.close()
        if self.reader is not None:
            ends = None if timeout is None else time.monotonic() + timeout
            self.reader.close(timeout)
            timeout = None if ends is None else max(0.0, ends - time.monotonic())
        for hashes, _ in self._pending.drain():
            assert self.host is not None
            self.host.unlock(hashes)
        if self.disk is not None:
            self.disk.close(timeout=timeout)

    def check(self) -> None:
        self.tiered.check_invariants()
