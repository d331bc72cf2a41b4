"""Disk pages read ahead of admission, off the engine loop: a waiting request's pages below the device are read from
their files into staging host memory by reader threads while the loop keeps stepping the other requests; the request
is admitted when the prefetch policy says so, and its pages then reach the pool in one batched copy.

Policies (SGLang HiCache's prefetch stops are the anchor), asked each time the scheduler would admit the request:
- `best_effort`: admit at once, with whatever pages have arrived; the rest is recomputed;
- `wait_complete`: admit once every page has been read, or the read stopped at a page that failed;
- `timeout`: as `wait_complete`, but at most `timeout_ms` after the prefetch started, then as `best_effort`.

Invariants:
- Only the pages read in order from the first count (`PrefetchJob.arrived`): a page that fails (a file deleted, a
  read error, a checksum or token mismatch, any exception) ends the usable run there, and its request recomputes it
  and everything after; nothing else is affected (the store deletes a corrupt file, as for any read).
- A job's staging memory is written only by the readers, and read only by the loop after it `take`s the job: a page
  is read once `ok[i]` is set under the lock, which the reader sets after its last write into the page's slice.
- Cancelling (`release`) stops the readers' work on the job at the next page; its staging buffer goes back to the
  kept ones (kv.tier.staging) once the loop has let go of the job (`release`, also after a `take`) and no reader
  task of it is left, never before: the loop copies out of a taken job's staging until it releases the job. The
  host pages a job holds are locked and unlocked by the loop thread only (KVTiers).
- A job whose staging cannot be allocated, or for which no reader thread can start, reads nothing: its request
  recomputes its pages, never waits on it, and the error reaches no caller (the call that starts a queued job may
  be another request's admission or cancel).
- At most `max_staged_pages` pages, and `max_staged_bytes` bytes of staging memory (kv.tier.staging: kept buffers
  included), are held at once over all jobs; past either a job waits, queued, until earlier ones are taken or
  released (one job alone always may start, whatever its pages), and for at most `pace_wait_s` for the staging
  that jobs let go still hold (their readers mid-page: a slow disk), never on the loop thread (a later `pace`
  starts it; then, still short, it reads nothing); a job's run is cut to the pages the byte bound holds
  (`max_job_pages`: kv.tier.prefetch_jobs; the rest is recomputed).
- Paced beside decodes, between steps: the loop calls `pace` before each step. While requests decode, the readers
  may start `pages_per_step` page reads (more when a `timeout` job would otherwise miss its deadline), and the loop
  waits until those reads are done (at most `window_s`) before it steps; no read starts during the step. Otherwise
  they read freely. A reader waits at most `pace_wait_s` (0.5 s) for the next step, so a loop that stops stepping
  (closing, or an engine dropped without closing) never holds them. `close` waits at most `CLOSE_WAIT_S` for a read
  in progress; a read that never returns (a stalled disk) is abandoned on its daemon thread (kv.tier.prefetch_reading's
  `ReaderPool`), which holds neither the close nor the process's exit. Nor its request: a job with no page done for
  `read_timeout_s` ends at its first page not arrived, as a failed read; and a reader stuck in a read that long is
  replaced (`_replace_stuck`, at each pace too: whatever became of its job). A reader's page costs CPU (the read
  from the page cache into staging, the checksum) and, in Python, the GIL: unpaced, two readers stretched the steps a
  2,000-token SmolLM2 prefix was read beside to 70 to 225 ms against 21 ms. Paced but reading during the steps (16
  pages a step, as before this window), a reader that took a core from one of the step's two OpenMP threads stalled
  its whole team at the next barrier: reading steps of 24 to 42 ms against 20. Between steps the two cores read the
  same 16 pages in about 1.5 ms (0.19 ms of CPU a page, before the native read) with nothing else to run.
This module is the loop thread's side (jobs started, paced, waited for, taken, released); the reader threads' side
(a task's pages in order, each page's read and check, the staging buffer's return) is kv.tier.prefetch_reading's.
Imports torch; nothing of the KV manager.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque

import torch

from radixcache.runtime.kv.pool import KVPool, populate
from radixcache.runtime.kv.tier.copy_sync import pins_host_memory
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.native_reads import split_reader
from radixcache.runtime.kv.tier.prefetch_job import PrefetchJob
from radixcache.runtime.kv.tier.prefetch_policy import (
    DEFAULT_PAGES_PER_STEP,
    DEFAULT_PREFETCH_POLICY,
    DEFAULT_PREFETCH_TIMEOUT_MS,
    check_pages_per_step,
    check_prefetch,
)
from radixcache.runtime.kv.tier.prefetch_reading import ReaderPool, ReaderThreads
from radixcache.runtime.kv.tier.staging import DEFAULT_KEEP_BYTES, DEFAULT_MAX_BYTES, StagingBuffers

log = logging.getLogger("radixcache.disk")


PACE_WAIT_S = 0.5  # the longest a reader waits for the loop's next step before it reads anyway
WINDOW_S = 0.005  # the longest the loop waits, before a step, for the reads it allowed to be done
READ_TIMEOUT_S = 10.0  # a started prefetch with no page done for this long has stalled: its pages are recomputed
CLOSE_WAIT_S = 5.0  # the longest a close waits for the readers' page reads in progress (ms each on a sound disk)
PREWARM_PAGES = 128  # staging pages written ahead as the reader starts (kv.tier.staging; within its bound)


class PrefetchReader(ReaderThreads):
    """Reader threads (`workers`) that read queued jobs' disk pages into staging memory, page by page in order (the
    threads' side: kv.tier.prefetch_reading's ReaderThreads)."""

    def __init__(
        self,
        disk: DiskStore,
        pool: KVPool,
        *,
        policy: str = DEFAULT_PREFETCH_POLICY,
        timeout_ms: float = DEFAULT_PREFETCH_TIMEOUT_MS,
        workers: int = 2,
        max_staged_pages: int = 4096,
        keep_staging_bytes: int = DEFAULT_KEEP_BYTES,
        max_staged_bytes: int | None = DEFAULT_MAX_BYTES,
        pages_per_step: int = DEFAULT_PAGES_PER_STEP,
        pace_wait_s: float = PACE_WAIT_S,
        prewarm_pages: int = PREWARM_PAGES,
        window_s: float = WINDOW_S,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        check_prefetch(policy, timeout_ms)
        self.read_timeout_s = read_timeout_s
        check_pages_per_step(pages_per_step)
        self.pages_per_step = pages_per_step
        self.pace_wait_s = pace_wait_s
        self.window_s = window_s
        self.disk = disk
        self.policy = policy
        self.timeout_s = float(timeout_ms) / 1000
        self.workers = workers
        self.max_staged_pages = max_staged_pages
        self.shape = (pool.num_layers, 2, pool.page_size, pool.kv_heads, pool.head_dim)
        self.dtype = pool.dtype
        self.pin = pins_host_memory(pool.device.type)
        self.buffers = StagingBuffers(
            self.shape, self.dtype, pin=self.pin, keep_bytes=keep_staging_bytes, max_bytes=max_staged_bytes
        )
        # Staging written ahead for the first prefetch (kv.tier.staging), then the pool's memory faulted in (a load
        # copies into blocks never written before), here, once: a background thread at the lowest priority did it
        # before, and while the engine kept both cores busy it lingered for seconds, taking page faults (and the
        # process's memory-map lock) beside the engine's own: a device hit's TTFT went from 41-60 ms to single
        # rounds of 71-177 ms in bench_tiers.py, a restart's disk hit from 63-110 ms to 54-214 ms.
        self._closed = False
        if prewarm_pages > 0:
            self.buffers.prewarm(prewarm_pages)
            pool_kv = getattr(pool, "kv", None)
            if pool_kv is not None:
                populate(pool_kv)
        self._cond = threading.Condition()  # guards every job's ok/failed_at/finished/cancelled; notified per page
        self._executor: ReaderPool | None = None
        self._queued: deque[PrefetchJob] = deque()  # over the staging bound: not started yet
        self._running: list[PrefetchJob] = []  # started, not yet taken or released
        self._staged = 0  # pages of started jobs not yet taken or released
        self._allowance: int | None = None  # page reads the readers may still start this step; None: no bound
        self._active = 0  # reader tasks submitted and not done (reading a page, or about to take the next)
        # Per reader thread, the buffer its page files' headers are read into, reused (kv.tier.disk_files)
        self._thread_buffers = threading.local()
        self._split = split_reader()  # a page file's read: native where the library builds (kv.tier.native_reads)
        self._reading = 0  # page reads in progress
        self._hung = 0  # of those, reads in progress for `read_timeout_s` (`_replace_stuck`): no pace waits for them
        self._reads: dict[object, list] = {}  # each read in progress: [its start (perf_counter), whether stuck]
        self._last_pace: float | None = None  # when the loop last paced (the step's length, for deadlines)

    @property
    def max_job_pages(self) -> int | None:
        """The most pages one job may stage (the byte bound's; None: no bound): longer runs are cut to it."""
        return self.buffers.max_pages

    # ------------------------------------------------------------------ the loop thread's side

    def submit(self, job: PrefetchJob) -> PrefetchJob:
        """Queue a job; it starts now unless staging is full (then once earlier jobs are taken or released)."""
        self._queued.append(job)
        self._start_queued()
        return job

    def pace(self, decoding: bool, now: float | None = None) -> None:
        """Before each step: while requests decode (`decoding`), the readers may start `pages_per_step` page reads,
        or as many as the earliest `timeout` deadline needs at the last step's pace, and this call returns once
        they are done (or after `window_s`), so that they do not run beside the step; none starts after it until
        the next call. Otherwise (or with `pages_per_step` 0) they read freely."""
        now = time.perf_counter() if now is None else now
        step_s, self._last_pace = (None if self._last_pace is None else now - self._last_pace), now
        if self._queued:
            self._start_queued()  # one waiting for the staging of a job let go may start now (`_start_queued`)
        with self._cond:
            if self._reads:
                self._replace_stuck(now)
            if not decoding or self.pages_per_step == 0:
                self._allowance = None
                self._cond.notify_all()
                return
            self._allowance = max(self.pages_per_step, self._needed_for_deadlines(now, step_s))
            self._cond.notify_all()
            end = time.perf_counter() + self.window_s
            while self._reading > self._hung or (self._allowance > 0 and self._active > self._reading):
                left = end - time.perf_counter()
                if left <= 0 or not self._cond.wait(left):
                    break
            self._allowance = 0  # the step runs alone

    def _needed_for_deadlines(self, now: float, step_s: float | None) -> int:
        """Page reads a step must allow so that every `timeout` job's pages are in by its deadline, at steps of
        `step_s` (0 when unknown or no job has a deadline). Under the lock."""
        if self.policy != "timeout" or not step_s or step_s <= 0:
            return 0
        needed = 0
        for job in self._started_jobs():
            if job.started is None:
                continue
            left = len(job) - job.finished
            steps = (job.started + self.timeout_s - now) / step_s - 1  # the last step before it only admits
            needed = max(needed, left if steps < 1 else math.ceil(left / steps))
        return needed

    def ready(self, job: PrefetchJob, now: float | None = None) -> bool:
        """Whether the policy lets the job's request be admitted now."""
        if self.policy == "best_effort":
            return True
        now = time.perf_counter() if now is None else now
        with self._cond:
            self._expire_stalled(job, now)
            if job.complete:
                return True
        if self.policy == "wait_complete" or job.started is None:
            return False
        return now - job.started >= self.timeout_s

    def _replace_stuck(self, now: float) -> None:
        """Each read in progress for `read_timeout_s` (whatever became of its job: taken, released) has its reader
        thread replaced, once (kv.tier.prefetch_reading's ReaderPool), and no pace waits for it. Under the lock."""
        for read in self._reads.values():
            if not read[1] and now - read[0] >= self.read_timeout_s:
                read[1] = True
                self._hung += 1
                if self._executor is not None:
                    self._executor.replace(1)

    def _expire_stalled(self, job: PrefetchJob, now: float) -> None:
        """A job with no page done for `read_timeout_s` since its start or its last page (a read that never returns:
        a stalled file system; no reader free to take it) ends at its first page not arrived, as a failed read: its
        request is admitted and recomputes them. The reads stuck that long get their reader threads replaced
        (`_replace_stuck`), so that the other requests' pages are still read. Under the lock."""
        since = job.progress_at
        if job.cancelled or job.complete or since is None or now - since < self.read_timeout_s:
            return
        first = job.arrived
        job.failed_at = first if job.failed_at is None else min(job.failed_at, first)
        self._replace_stuck(now)
        log.warning(
            "disk KV cache: no page of a prefetch read for %.1f s (a stalled disk?); recomputing %d page(s), %d read(s)"
            " still blocked",
            now - since,
            len(job) - first,
            job.reading,
        )
        self._cond.notify_all()

    def wait(self, timeout: float) -> None:
        """Block the loop (which has nothing else to run) until the jobs being read are complete (`best_effort`:
        until a page arrives), or `timeout` seconds, or a timeout policy's deadline passes; return at once when no
        job is being read. Waking at every page instead, the loop took the GIL from the readers 16 to 35 times
        while a 37-page prefix came in (a restart's disk hit in scripts/bench_tiers.py)."""
        with self._cond:
            now = time.perf_counter()
            for job in self._started_jobs():
                self._expire_stalled(job, now)
            pending = [j for j in self._started_jobs() if not j.complete]
            if not pending:
                if self._queued:  # waiting for a let-go job's staging: its reader's return notifies (`_recycle`)
                    self._cond.wait(timeout)
                return
            if self.policy == "timeout":
                first = min(j.started or 0.0 for j in pending) + self.timeout_s
                timeout = max(0.0, min(timeout, first - time.perf_counter()))
            if self.policy == "best_effort":
                self._cond.wait(timeout)
            else:
                self._cond.wait_for(lambda: all(j.complete for j in self._started_jobs()), timeout)

    def take(self, job: PrefetchJob) -> tuple[int, torch.Tensor | None]:
        """Stop the job and hand its usable pages to the caller: (how many, the staging tensor). The readers touch
        the staging memory no more once this returns for the pages counted (they are done with them). The caller
        copies them out, then `release`s the job (its staging may be reused from then on)."""
        with self._cond:
            job.cancelled = True
            return job.arrived, job.staging

    def release(self, job: PrefetchJob) -> None:
        """Cancel the job (the readers skip its remaining pages); its staging memory goes with its last reader."""
        with self._cond:
            job.cancelled = True
            self._cond.notify_all()  # readers waiting for the pace skip its pages at once
        self._let_go(job)

    def close(self, timeout: float | None = CLOSE_WAIT_S) -> bool:
        """Cancel everything and wait for the readers to stop: at most `timeout` seconds (None: `CLOSE_WAIT_S`), a
        page read being all a reader may still be doing. Readers whose read has not returned by then (a stalled
        network file system) are abandoned, with one warning: daemon threads, which hold neither this close nor the
        process's exit, and which finish their page (its staging, the store's index) if it ever returns. Whether
        every reader stopped."""
        wait_s = CLOSE_WAIT_S if timeout is None else max(0.0, min(timeout, CLOSE_WAIT_S))
        again = self._closed and self._executor is None  # the readers abandoned then: not waited for, nor logged
        wait_s = 0.0 if again else wait_s
        self._closed = True
        with self._cond:
            self._cond.notify_all()  # readers waiting for the pace go
            for job in self._queued:
                job.cancelled = True
            stopped = self._cond.wait_for(lambda: self._active <= 0, wait_s)
            hung = self._reading
        self._queued.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if not stopped and not again:
            log.warning(
                "disk KV cache: %d page read(s) still blocked after %.1f s at close (a stalled disk?); abandoned",
                hung,
                wait_s,
            )
        return stopped

    def read_now(self, job: PrefetchJob) -> tuple[int, torch.Tensor | None]:
        """Read a job on the calling thread, stopping at the first failed page (for a direct caller of the KV
        manager, which has not prefetched); the same batched staging as the readers. `release` it after use."""
        try:
            self._check_room(len(job), 0.0)  # the caller waits: no wait for other jobs' staging
            job.take_buffer(*self.buffers.get(len(job)))
        except Exception:  # no staging memory: as for a queued job, nothing is read and the caller recomputes
            log.exception("disk KV cache: no staging for a read of %d page(s); recomputing them", len(job))
            job.started, job.failed_at = time.perf_counter(), 0
            return 0, None
        job.started = time.perf_counter()
        for i in range(len(job)):
            self._read_page(job, i, paced=False)  # the caller waits for these pages: no pace
            if job.failed_at is not None:
                break
        with self._cond:
            job.tasks = 0  # no reader task: `release` hands the buffer back
        return job.arrived, job.staging

    # ------------------------------------------------------------------ private

    def _started_jobs(self) -> list[PrefetchJob]:
        return [j for j in self._running if not j.cancelled]

    def _start_queued(self) -> None:
        while self._queued and not self._closed:
            job = self._queued[0]
            if job.cancelled:
                self._queued.popleft()
                continue
            if self._staged and (self._staged + len(job) > self.max_staged_pages or not self.buffers.fits(len(job))):
                return  # waits for a take or release
            if not self._staged and not self.buffers.fits(len(job)) and not self._waited_out(job):
                return  # waits for the staging of jobs let go, which their readers hand back after their last page
            self._queued.popleft()
            try:
                self._check_room(len(job), 0.0)
                job.take_buffer(*self.buffers.get(len(job)))
            except Exception:  # no staging memory: it reads nothing, and its request recomputes (never waits on it)
                log.exception("disk KV cache: no staging for a prefetch of %d page(s); recomputing them", len(job))
                with self._cond:
                    job.started, job.failed_at = time.perf_counter(), 0
                continue
            self._staged += len(job)
            if self._executor is None:
                self._executor = ReaderPool(self.workers, "radixcache-prefetch")
            self._running.append(job)
            readers = min(self.workers, len(job))
            with self._cond:
                job.started = job.progress_at = time.perf_counter()
                job.tasks = len(job)
                self._active += readers  # counted from now: a pace right after this waits for their first reads
            # a task per reader, not per page: the loop thread submits two, where 125 page tasks had it fight the
            # readers that start on the first ones for the GIL (45 ms on this 2-core machine, beside a decode)
            started = sum(self._submit_reader(job) for _ in range(readers))
            with self._cond:
                self._active -= readers - started
                if not started:  # no reader: it reads nothing, and its request recomputes (never waits on it)
                    job.failed_at, job.tasks = 0, 0
                self._cond.notify_all()

    def _waited_out(self, job: PrefetchJob) -> bool:
        """Whether a queued job has waited `pace_wait_s` for the staging of jobs let go (their readers on a last page,
        a slow one): it then starts, finds no staging and reads nothing (its request recomputes). Never waited for on
        the loop: a later call (`pace`, before each step; a take or release) starts it. The loop used to wait here
        for up to 0.5 s, every stream stalled, then fail it."""
        now = time.perf_counter()
        if job.held_since is None:
            job.held_since = now
        return now - job.held_since >= self.pace_wait_s

    def _check_room(self, pages: int, wait_s: float) -> None:
        """Raise unless staging for `pages` fits the byte bound within `wait_s` (the readers of jobs let go hand
        their buffers back after their last page)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.buffers.fits(pages), wait_s):
                raise MemoryError(f"{pages} page(s) of staging over its bound of {self.buffers.max_bytes} bytes")

    def _let_go(self, job: PrefetchJob) -> None:
        """The loop is done with a job (taken or released): its pages leave the staging bound; queued jobs start."""
        with self._cond:
            job.let_go = True
            self._recycle(job)
        if job in self._running:
            self._running.remove(job)
            self._staged -= len(job)
        elif job in self._queued:
            self._queued.remove(job)
        self._start_queued()
