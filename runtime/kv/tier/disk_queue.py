"""Adopted pages handed to the disk writer (kv.tier.disk_store), in the order that keeps a run usable.

A run of pages is found from its head (a page's hash names its whole prefix), so a tail without its head is never
read. The pages are queued tail first: the head is written last, the newest in the store's LRU (and by mtime, across
restarts), so a size limit deletes a run's tail before its head. What fits the write queue is the head (the writer
only empties it), and a put that raises drops its own page, not those before it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.kv.tier.disk_format import page_meta
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.load_costs import TierTally

log = logging.getLogger("radixcache.disk")


def queue_disk_writes(
    disk: DiskStore, pool: KVPool, counts: TierTally, hashes: list[bytes], blocks: Sequence[int], tokens: Sequence[int]
) -> None:
    """Queue the pages of `hashes` (a run's, head first; `blocks` their device blocks, `tokens` their tokens) that the
    disk does not hold, counting each as queued or dropped in `counts`."""
    todo = [i for i, h in enumerate(hashes) if disk.count_prefix([h]) == 0]
    room = max(0, disk.max_pending - disk.stats().pending_writes) if disk.enabled else 0
    counts["disk_dropped_pages"] += len(todo) - min(room, len(todo))
    if not (todo := todo[:room]):  # a full, read-only or unusable disk: counted, so that the tier shows off
        return
    p = pool.page_size
    pages = pool.kv.index_select(2, torch.tensor([blocks[i] for i in todo], device=pool.device)).to("cpu")
    meta = page_meta(pool)
    failed: Exception | None = None
    for j, i in reversed(list(enumerate(todo))):
        payload = pages[:, :, j].contiguous().view(torch.uint8).numpy().tobytes()
        try:
            queued = disk.put(hashes[i], tokens[i * p : (i + 1) * p], payload, meta)
        except Exception as exc:
            queued, failed = False, failed or exc
        counts["disk_queued_pages" if queued else "disk_dropped_pages"] += 1
    if failed is not None:
        log.error("disk KV cache: queueing a page failed; not written", exc_info=failed)
