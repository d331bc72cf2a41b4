"""One request's run of disk pages being read ahead of its admission (kv.tier.prefetch): which pages, which have
arrived (consecutively from the first: the only ones usable), and the staging memory they land in. The reader
threads write its fields under the reader's lock; see kv.tier.prefetch for the invariants. A reader's task for a
job (`ReaderTask`). And `plan_prefetch`: which run to read for a prompt, given the cache now."""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence

import torch

from radixcache.page_hash import PageChain
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.load_costs import LoadCosts
from radixcache.runtime.kv.tier.staging import PageRows
from radixcache.tier.tiered_cache import TieredCache


class PrefetchJob:
    """One request's run of disk pages, `first_page` onwards (page indices in its prompt), being read."""

    def __init__(self, first_page: int, hashes: list[bytes], tokens: list[Sequence[int]], host: list[bytes]):
        self.first_page = first_page
        self.hashes = hashes
        self.tokens = tokens  # each page's own token ids: a read checks them (a hash is never trusted alone)
        self.host_hashes = host  # host pages before the run, locked for this request until it is taken or released
        self.staging: torch.Tensor | None = None  # [layers, 2, pages, page_size, kv_heads, head_dim], once started
        self.buffer: torch.Tensor | None = None  # the kept buffer `staging` views (kv.tier.staging)
        self.rows: PageRows | None = None  # each page's byte rows in `buffer`, which the readers read into
        self.tasks = 0  # its pages not yet done by a reader (queued or being read)
        self.next_page = 0  # the next page a reader takes (pages go in order)
        self.let_go = False  # the loop is done with it: the buffer goes back once `tasks` reaches 0
        self.ok = [False] * len(hashes)
        self.failed_at: int | None = None  # the first page that failed, if any
        self.failure_counted = False  # in disk_failed_reads (kv.tier.prefetch_jobs), once a job
        self.finished = 0  # pages the readers are done with (read, failed or skipped)
        self.cancelled = False
        self.started: float | None = None  # perf_counter when queued to the readers
        self.held_since: float | None = None  # perf_counter when it first waited for a let-go job's staging
        self.read_seconds = 0.0  # summed over pages (the readers overlap)
        self.progress_at: float | None = None  # perf_counter of its start or its last page done (a stall's clock)
        self.reading = 0  # its page reads in progress
        # the mtime its pages' reads stamp, less 1 us a page: the head newest by mtime too (kv.tier.prefetch)
        self.stamp_ns = time.time_ns()

    def take_buffer(self, buffer: torch.Tensor | None, staging: torch.Tensor | None) -> None:
        """The staging memory this job's pages are read into (a kept buffer and its view of them), or none."""
        self.buffer, self.staging = buffer, staging
        self.rows = None if buffer is None else PageRows(buffer)

    def __len__(self) -> int:
        return len(self.hashes)

    def covers(self, page: int, page_hash: bytes) -> bool:
        """Whether this run holds prompt page `page`, with that hash (then it serves a load that starts there)."""
        i = page - self.first_page
        return 0 <= i < len(self.hashes) and self.hashes[i] == page_hash

    @property
    def arrived(self) -> int:
        """Pages read, consecutively from the first (the only ones usable)."""
        n = 0
        while n < len(self.ok) and self.ok[n]:
            n += 1
        return n

    @property
    def complete(self) -> bool:
        """Every page read, or every page before the first failure."""
        end = len(self.ok) if self.failed_at is None else self.failed_at
        return self.started is not None and self.arrived >= end


class ReaderTask:
    """One reader's task for a job; whether it began, or was abandoned because its submission raised (both under
    the reader's lock)."""

    __slots__ = ("abandoned", "began", "job")

    def __init__(self, job: PrefetchJob) -> None:
        self.job = job
        self.began = False
        self.abandoned = False


def plan_prefetch(
    tiered: TieredCache, disk: DiskStore, costs: LoadCosts, tokens: Sequence[int], namespace: Hashable, chain: PageChain
) -> tuple[int, list[bytes], int, int] | None:
    """(first disk page, the page hashes, pages on disk from there, pages on the host before it), or None when
    nothing is worth reading from disk now. Changes nothing in the device tree (a peek)."""
    p, host = tiered.page_size, tiered.host
    full = len(tokens) // p
    device = tiered.device.peek(tokens, namespace=namespace).length // p  # changes nothing
    if full <= device:
        return None
    hashes = chain.upto(tokens, full)
    on_host = host.count_prefix(hashes, device) if host is not None else 0
    start = device + on_host
    pages = disk.count_prefix(hashes[start:]) if start < full else 0
    worth = costs.worth_loading("disk") and (not on_host or costs.worth_loading("host"))
    return (start, hashes, pages, on_host) if pages and worth else None
