"""The prefetch readers' side of kv.tier.prefetch (its PrefetchReader inherits `ReaderThreads`): a reader task's turn
over its job's pages, the next one no reader has taken, in order; each page waiting for the loop's pace, read from
its file straight into the job's staging rows (one vectored read, native where the library builds) and checked; a
page that fails ends the job's usable run there; and the job's staging buffer handed back once nobody uses it. The
invariants are kv.tier.prefetch's; the state is the reader's (declared here), changed under its lock as there.
Imports torch; nothing of the KV manager.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable

import torch

from radixcache.runtime.kv.tier.disk_files import SplitRead
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.prefetch_job import PrefetchJob, ReaderTask
from radixcache.runtime.kv.tier.staging import StagingBuffers

log = logging.getLogger("radixcache.disk")

HEAD_BYTES = 4096  # a page file's bytes before its payload (header, token ids): a reader's buffer grows past it


class ReaderPool:
    """Up to `workers` daemon threads that run the calls submitted, in order, each on the first thread free; threads
    start as calls wait for one. A ThreadPoolExecutor's threads are joined at interpreter exit, so a page read that
    never returns (a stalled network file system) held the process's exit for ever; a daemon thread is abandoned
    there. `shutdown`, or the pool collected, drops the calls not started and has each thread exit once its call
    returns (the threads hold the queue and the counts, never the pool)."""

    def __init__(self, workers: int, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[tuple[Callable[..., object], tuple] | None] = queue.SimpleQueue()
        self._counts = _PoolCounts(workers)
        self._threads: list[threading.Thread] = []
        self._stop = weakref.finalize(self, _stop_threads, self._calls, self._counts, self._threads)

    def submit(self, fn: Callable[..., object], *args: object) -> None:
        """Queue `fn(*args)`; RuntimeError after `shutdown`, or from a thread that cannot start (the call stays
        queued then, for a thread already running)."""
        counts = self._counts
        with counts.lock:
            if not self._stop.alive:
                raise RuntimeError("the reader pool is shut down")
            self._calls.put((fn, args))
            counts.waiting += 1
            self._start_thread()

    def replace(self, blocked: int) -> None:
        """`blocked` threads are stuck in calls that may never return (a stalled disk; negative: that many came
        back): as many more threads may run meanwhile, up to twice `workers` in all, so that the calls behind them
        still run; a thread past the count exits after its call."""
        counts = self._counts
        with counts.lock:
            counts.blocked = max(0, counts.blocked + blocked)
            if blocked > 0 and self._stop.alive:
                self._start_thread()

    def _start_thread(self) -> None:
        """Start a thread when a call waits for one and the count allows it (the counts' lock held)."""
        counts = self._counts
        self._threads[:] = [t for t in self._threads if t.is_alive()]  # (in place: the finalizer holds the list)
        if counts.waiting <= counts.idle or len(self._threads) >= counts.allowed():
            return
        name = f"{self._name}_{counts.started}"
        thread = threading.Thread(target=_serve, args=(self._calls, counts), name=name, daemon=True)
        thread.start()  # raises RuntimeError at the process's thread limit
        counts.started += 1
        self._threads.append(thread)

    def shutdown(self, wait: bool = False, cancel_futures: bool = True) -> None:
        """Drop the calls not started; each thread exits once its call returns (never waited for here). The
        arguments are ThreadPoolExecutor's; these are the only values this pool takes."""
        assert not wait and cancel_futures
        self._stop()


class _PoolCounts:
    """A ReaderPool's counts, shared with its threads: threads waiting for a call, calls no thread has taken, threads
    running, threads stuck in a call (`ReaderPool.replace`), threads ever started (their names)."""

    def __init__(self, workers: int) -> None:
        self.lock = threading.Lock()
        self.workers = workers
        self.idle = self.waiting = self.running = self.blocked = self.started = 0

    def allowed(self) -> int:
        """How many threads may run: `workers`, and one more for each stuck in a call, up to twice `workers`."""
        return self.workers + min(self.blocked, self.workers)


def _serve(calls: queue.SimpleQueue, counts: _PoolCounts) -> None:
    """A ReaderPool thread: the calls in order until a None, or until more threads run than the count allows (after
    a stuck call came back)."""
    with counts.lock:
        counts.running += 1
    while True:
        with counts.lock:
            if counts.running > counts.allowed():
                counts.running -= 1
                return
            counts.idle += 1
        call = calls.get()
        with counts.lock:
            counts.idle -= 1
            counts.waiting -= call is not None
        if call is None:
            with counts.lock:
                counts.running -= 1
            return
        try:
            call[0](*call[1])
        except Exception:  # the reader's own work catches its errors; a bug must not end the thread
            log.exception("disk KV cache: a prefetch reader call failed")
        del call  # hold nothing of the call (its reader) while waiting for the next


def _stop_threads(calls: queue.SimpleQueue, counts: _PoolCounts, threads: list[threading.Thread]) -> None:
    """Drop the calls not started, and have each thread exit after its call (a None each)."""
    with counts.lock:
        while True:
            try:
                calls.get_nowait()
            except queue.Empty:
                break
        counts.waiting = 0
        for _ in threads:
            calls.put(None)


class ReaderThreads:
    """The reader threads' work for PrefetchReader, over the state it sets up (declared here)."""

    disk: DiskStore
    policy: str
    pace_wait_s: float
    shape: tuple[int, ...]
    dtype: torch.dtype
    buffers: StagingBuffers
    _closed: bool
    _cond: threading.Condition
    _executor: ReaderPool | None
    _allowance: int | None
    _active: int
    _reading: int
    _hung: int
    _reads: dict[object, list]
    _thread_buffers: threading.local
    _split: SplitRead

    def _submit_reader(self, job: PrefetchJob) -> bool:
        """Submit a reader task for `job`; False when its thread could not start (the process's thread limit), and
        the task, queued anyway by the executor, then never reads (an older reader may reach it later). Never
        raises: this runs in whichever call starts the job, another request's admission or cancel among them."""
        task = ReaderTask(job)
        assert self._executor is not None
        try:
            self._executor.submit(self._read_pages, task)
        except Exception:
            log.exception("disk KV cache: a prefetch reader could not start")
            with self._cond:
                task.abandoned = not task.began  # a reader that took it meanwhile reads as any other
                return not task.abandoned
        return True

    def _read_pages(self, task: ReaderTask) -> None:
        """A reader's share of `task.job`: the next page no reader has taken, until none is left (`_active` counted
        this task when it was submitted, unless its submission failed: then it does nothing)."""
        job = task.job
        with self._cond:
            if task.abandoned:
                return
            task.began = True
        try:
            while True:
                with self._cond:
                    i = job.next_page
                    if i >= len(job):
                        return
                    job.next_page += 1
                self._read_page(job, i)
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def _read_page(self, job: PrefetchJob, i: int, paced: bool = True) -> None:
        """A reader's work for page `i` of `job`: wait for the pace, read the file into its staging rows and check
        it."""
        with self._cond:
            give_up = time.monotonic() + self.pace_wait_s
            while paced and self._allowance is not None and self._allowance <= 0 and not self._stopping(job, i):
                if not self._cond.wait(max(0.0, give_up - time.monotonic())):
                    break  # no step came: the loop is not stepping beside anyone, nothing to pace against
            skip = self._stopping(job, i)
            if not skip and paced and self._allowance:
                self._allowance -= 1
            if not skip:
                self._reading += 1
                job.reading += 1
                read = self._reads[token := object()] = [time.perf_counter(), False]
        ok = False
        t0 = time.perf_counter()
        if not skip:
            try:
                with torch.inference_mode():  # the loop made the staging tensor under inference mode
                    ok = self._read_into(job, i)
            except Exception:
                log.exception("disk KV cache: prefetching a page failed; recomputing it")
        with self._cond:
            if ok and (job.failed_at is None or i < job.failed_at):  # (a page past a stall's end: never used)
                job.ok[i] = True
            elif not skip and not ok:
                job.failed_at = i if job.failed_at is None else min(job.failed_at, i)
            if not skip:
                self._reading -= 1
                job.reading -= 1
                job.progress_at = time.perf_counter()
                del self._reads[token]
                if read[1]:  # a read found stuck came back: its thread's replacement goes
                    self._hung -= 1
                    if self._executor is not None:
                        self._executor.replace(-1)
            job.finished += 1
            job.read_seconds += time.perf_counter() - t0
            job.tasks -= 1
            self._recycle(job)
            # Wake the waiters only when one may go on: the loop's pace (a read done, while paced) or its wait (a
            # job complete, a page failed; any page under best_effort). Woken at every page, the idle loop took the
            # GIL from the readers 37 times while a restart's 37 pages came in, each wake a reader's delay.
            if self._allowance is not None or not ok or self.policy == "best_effort" or job.complete:
                self._cond.notify_all()

    def _stopping(self, job: PrefetchJob, i: int) -> bool:
        """Whether page `i` of `job` is no longer to be read (cancelled, closed, or after a failed page). Under the
        lock."""
        return job.cancelled or self._closed or (job.failed_at is not None and i > job.failed_at)

    def _recycle(self, job: PrefetchJob) -> None:
        """Give the job's staging buffer back once nobody uses it (the loop let go, no reader task left). Under
        the lock."""
        if job.let_go and job.tasks == 0 and job.buffer is not None:
            self.buffers.put(job.buffer)
            job.take_buffer(None, None)
            self._cond.notify_all()  # a job waiting for staging memory (`_check_room`) may start

    def _read_into(self, job: PrefetchJob, i: int) -> bool:
        """Read page `i`'s file with its payload straight into the job's staging memory (one vectored read: no
        buffer to copy out of, no torch kernel and so no OpenMP team on this thread); whether it arrived."""
        head = getattr(self._thread_buffers, "head", None)  # each reader thread reads every page's header into one
        if head is None:
            head = self._thread_buffers.head = bytearray(HEAD_BYTES)
        assert job.rows is not None
        # Each read's mtime falls with its place in the run (the readers take pages head first): after a restart,
        # which orders the index by mtime, a size limit deletes the run's tail first, as `refresh` orders it now.
        stamp = job.stamp_ns - i * 1000  # 1 us apart: a file system keeping microseconds tells them apart
        meta = self.disk.read_into(job.hashes[i], job.tokens[i], job.rows(i), head, self._split, stamp)
        # a page of another shape or dtype cannot come under one fingerprint; never use its bytes
        return meta is not None and meta.get("dtype") == str(self.dtype) and tuple(meta.get("shape", ())) == self.shape
