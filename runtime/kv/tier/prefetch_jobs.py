"""Each waiting request's prefetch, for the tiers (kv.tier.coordinator's KVTiers): which run of disk pages its
prompt needs read ahead (kv.tier.prefetch_job's `plan_prefetch`), the job the readers read it in (kv.tier.prefetch),
the host pages held for it until admission, and, at admission, its pages copied into the request's blocks (or read
there, for a caller that never prefetched). Runs on the engine loop thread, as KVTiers does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Sequence

from radixcache.page_hash import PageChain
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.host_recency import HostPageTier
from radixcache.runtime.kv.tier.layered_load import LayeredLoad
from radixcache.runtime.kv.tier.load_costs import LoadCosts, TierTally
from radixcache.runtime.kv.tier.page_copy import copy_staged
from radixcache.runtime.kv.tier.prefetch import PrefetchJob, PrefetchReader
from radixcache.runtime.kv.tier.prefetch_job import plan_prefetch
from radixcache.tier.tiered_cache import TieredCache, TierMatch

log = logging.getLogger("radixcache.disk")


class PrefetchJobs:
    """The prefetch jobs of waiting requests, by request id, over one disk store's `reader` (None: no disk tier)."""

    def __init__(
        self,
        tiered: TieredCache,
        reader: PrefetchReader | None,
        disk: DiskStore | None,
        pool: KVPool,
        costs: LoadCosts,
        counts: TierTally,
    ) -> None:
        self.tiered, self.reader, self.disk, self.pool = tiered, reader, disk, pool
        self.costs, self._counts = costs, counts
        self.page_size = pool.page_size
        # rid -> its prefetch (None: nothing to read), from the first `prefetch` until its load or `cancel_prefetch`
        self._prefetch: dict[int, PrefetchJob | None] = {}

    @property
    def host(self) -> HostPageTier | None:
        return self.tiered.host  # type: ignore[return-value]  # KVTiers' HostPageTier

    def pop(self, rid: int | None) -> tuple[bool, PrefetchJob | None]:
        """Whether request `rid` prefetched, and its job (None: nothing to read), which the caller now owns."""
        prefetched = rid is not None and rid in self._prefetch
        return prefetched, self._prefetch.pop(rid, None) if prefetched else None  # type: ignore[arg-type]

    def close(self) -> None:
        """Cancel every prefetch (KVTiers.close, before the readers stop)."""
        for rid in list(self._prefetch):
            self.cancel_prefetch(rid)

    def prefetch(self, rid: int, tokens: Sequence[int], namespace: Hashable, chain: PageChain) -> bool:
        """Have request `rid`'s disk pages (those after what the device and the host hold of `tokens` now) read by
        the readers, then say whether the prefetch policy lets it be admitted now. Each call plans again (a peek,
        no change to the tree): a prefetch that no longer starts where the prompt now leaves the device and the
        host (pages evicted, or written to disk, meanwhile) is replaced. Never raises: a prefetch that cannot
        start reads nothing (those pages are recomputed)."""
        if self.reader is None:
            return True
        job = self._prefetch.get(rid)
        try:
            plan = plan_prefetch(self.tiered, self.reader.disk, self.costs, tokens, namespace, chain)
            if plan is None or job is None or not job.covers(plan[0], plan[1][plan[0]]):
                if job is not None:
                    self._end_job(job)
                job = self._prefetch[rid] = None if plan is None else self._start_job(tokens, *plan)
        except Exception:
            log.exception("disk KV cache: starting a prefetch failed; recomputing its pages")
            self._prefetch.setdefault(rid, None)
        job = self._prefetch.setdefault(rid, job)
        return job is None or self.reader.ready(job)

    def pace_prefetch(self, decoding: bool, wait: float = 0.0) -> None:
        """Before each step: bound the readers' page reads to the step's pace while requests decode
        (kv.tier.prefetch `PrefetchReader.pace`); with `wait` (the loop has nothing to run), `wait_prefetch` too."""
        if self.reader is not None:
            self.reader.pace(decoding)
        if wait > 0:
            self.wait_prefetch(wait)

    def wait_prefetch(self, timeout: float) -> None:
        """The loop has nothing to run: wait (at most `timeout` s) for a page to arrive or a policy's deadline."""
        if self.reader is not None:
            self.reader.wait(timeout)

    def cancel_prefetch(self, rid: int) -> None:
        """Request `rid` left, or will not be admitted: stop its reads, unlock the host pages it held."""
        job = self._prefetch.pop(rid, None)
        if job is not None:
            self._end_job(job)

    def _start_job(
        self, tokens: Sequence[int], start: int, hashes: list[bytes], pages: int, on_host: int
    ) -> PrefetchJob:
        assert self.reader is not None
        held = hashes[start - on_host : start]
        if held:
            assert self.host is not None
            self.host.lock(held)  # the disk run chains on these: keep them until the request is admitted
        return self.reader.submit(self._new_job(hashes, tokens, start, start + pages, held))

    def _new_job(
        self, hashes: Sequence[bytes], tokens: Sequence[int], start: int, end: int, held: list[bytes]
    ) -> PrefetchJob:
        p, most = self.page_size, self.reader.max_job_pages if self.reader is not None else None
        end = end if most is None else min(end, start + most)  # past the staging's byte bound: recomputed
        page_tokens = [tokens[i * p : (i + 1) * p] for i in range(start, end)]
        return PrefetchJob(start, list(hashes[start:end]), page_tokens, held)

    def _end_job(self, job: PrefetchJob) -> None:
        assert self.reader is not None
        self.reader.release(job)
        self._count_failure(job)
        self._forget_unread(job)
        self._let_host_go(job)

    def _count_failure(self, job: PrefetchJob) -> None:
        """A job whose read failed counts once in disk_failed_reads, whether its request loads any of its pages or not:
        a failed first page leaves the disk index (a corrupt file is deleted), so the admission then plans no disk load
        at all, and the job ended uncounted (a run of truncated files: pages deleted, warnings, 0 failed reads)."""
        if job.failed_at is not None and not job.failure_counted:
            job.failure_counted = True
            self._counts["disk_failed_reads"] += 1

    def _let_host_go(self, job: PrefetchJob) -> None:
        """Unlock the host pages the job held. At admission, before the admission refreshes its run: an unlock makes
        pages the newest, and later they were newer than the run's head (the head goes last)."""
        if job.host_hashes:
            assert self.host is not None
            self.host.unlock(job.host_hashes)
            job.host_hashes = []

    def _forget_unread(self, job: PrefetchJob) -> None:
        """A read that failed ends the job's run: the later pages whose files vanished too (a `cache clear`, another
        process's eviction) leave the disk index, or the request recomputes them and they are never written again
        (the index says they are there). One lstat a page, after a failure only."""
        if job.failed_at is not None and self.disk is not None:
            self.disk.forget_missing(job.hashes[job.failed_at + 1 :])

    def load_disk(
        self,
        match: TierMatch,
        tokens: Sequence[int],
        start: int,
        disk_pages: int,
        blocks: Sequence[int],
        job: PrefetchJob | None,
        later: list[LayeredLoad] | None = None,
    ) -> int:
        """Copy up to `disk_pages` usable pages from prompt page `start` on into `blocks`; the pages copied. From the
        prefetch `job`, or with `job` None (the request never prefetched) read here first, on the caller's thread.
        With `later`, the copy is deferred instead: a LayeredLoad, appended to it, does it and then ends the job."""
        assert self.reader is not None
        own = job is None
        job = self._new_job(match.hashes, tokens, start, start + disk_pages, []) if job is None else job
        try:
            got, staging = self.reader.read_now(job) if own else self.reader.take(job)
            skip = start - job.first_page  # the prefetch began at its own first page; use it from `start` on
            got = 0 if skip < 0 or job.hashes[skip : skip + 1] != match.hashes[start : start + 1] else got - skip
            got = max(0, min(got, disk_pages))
            if job.failed_at is not None:
                self._count_failure(job)
            elif not own:
                self._forget_unarrived(job, max(0, skip) + got)
            if got and staging is not None and later is not None:
                end = self.reader.release if own else self._end_job
                later.append(LayeredLoad(self.pool, staging[:, :, skip:], got, blocks, lambda: end(job)))
                self.costs.note_load("disk", got, job.read_seconds * (got / max(1, job.arrived)))
            elif got and staging is not None:
                t0 = time.perf_counter()
                try:
                    copy_staged(self.pool, staging[:, :, skip:], got, blocks)
                except Exception:  # a failed read: the request recomputes them, over what the copy wrote
                    log.exception("disk KV cache: copying %d read page(s) into the pool failed; recomputing", got)
                    self._counts["disk_failed_reads"] += 1
                    return 0
                seconds = time.perf_counter() - t0 + job.read_seconds * (got / max(1, job.arrived))
                self.costs.note_load("disk", got, seconds)
            self._counts["disk_loaded_pages"] += got
            return got
        finally:
            if own and not later:
                self.reader.release(job)  # its staging goes back to the kept buffers
                self._forget_unread(job)

    def _forget_unarrived(self, job: PrefetchJob, used: int) -> None:
        """The pages of a taken job past its first `used` are recomputed (admitted before they arrived: best_effort, a
        timeout); those whose files are gone (a `cache clear` since this process opened the directory, another
        process's eviction) leave the disk index, or the recomputed pages were never written again (the index said
        they were there), and a restart found none of them. One lstat a page, for pages about to be recomputed."""
        if self.disk is not None and used < len(job):
            self.disk.forget_missing(job.hashes[used:])
