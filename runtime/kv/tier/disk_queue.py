"""Adopted pages handed to the disk writer (kv.tier.disk_store), in the order that keeps a run usable.

A run of pages is found from its head (a page's hash names its whole prefix), so a tail without its head is never
read. The pages are queued head first, so a process killed mid-run (kill -9, the OOM killer) leaves a prefix a
restart reads, each with its parent (the run's page before it): the store stamps it just older than its parent as it
writes it (`PageIndex.place`), so a run's head stays its newest page in the store's LRU and by mtime, and a size limit
deletes a run's tail before its head, however many commits (prefill chunks, decode pages) the run took to arrive,
without stamping the run again at each. A run is cut to what fits: the write queue's room, and the store's size limit
(writing past it would evict the run's own head); a put that raises drops its own page (the pages after it are then
not written either: their parent is not held), not one already queued by another request (it is still written).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.kv.tier.disk_format import encode_page, page_meta
from radixcache.runtime.kv.tier.disk_store import DiskStore
from radixcache.runtime.kv.tier.load_costs import TierTally

log = logging.getLogger("radixcache.disk")


def queue_disk_writes(
    disk: DiskStore,
    pool: KVPool,
    counts: TierTally,
    hashes: list[bytes],
    blocks: Sequence[int],
    tokens: Sequence[int],
    parent: bytes | None = None,
) -> None:
    """Queue the pages of `hashes` (a run's, head first; `blocks` their device blocks, `tokens` their tokens) that the
    disk neither holds nor has queued, counting each as queued or dropped in `counts`. `parent`: the hash of the run's
    page before the first of them (None: they start the run); each page is queued with the one before it as its
    parent."""
    held = [disk.holds(h) for h in hashes]  # one queued already is written: not dropped
    # A parent the disk does not hold (its file deleted since: corrupt, another process's eviction) is a gap: the
    # pages after it are never read (a run is found from its head), so none is queued. The writer drops a page whose
    # parent is missing as it writes it, but not one whose parent is a page it skipped as held.
    end = 0 if parent is not None and not disk.holds(parent) else len(hashes)
    todo = [i for i in range(end) if not held[i]]
    room = max(0, disk.max_pending - disk.stats().pending_writes) if disk.enabled else 0
    counts["disk_dropped_pages"] += len(todo) - min(room, len(todo)) + held[end:].count(False)
    if not (todo := todo[:room]):  # a full, read-only or unusable disk: counted, so that the tier shows off
        return
    p = pool.page_size
    pages = pool.kv.index_select(2, torch.tensor([blocks[i] for i in todo], device=pool.device)).to("cpu")
    meta = page_meta(pool)
    failed: Exception | None = None
    budget = disk.max_bytes
    for j, i in enumerate(todo):  # head first
        payload = pages[:, :, j].contiguous().view(torch.uint8).numpy().tobytes()
        page_tokens = tokens[i * p : (i + 1) * p]
        try:
            write = encode_page(hashes[i], disk.fingerprint, page_tokens, payload, meta)  # once: budgeted, queued
            size = write.size
            if j == 0:  # the run's pages the disk holds already take their room too (they are its first, as a rule)
                budget -= size * (len(hashes) - len(todo))
            if size > budget:  # past the limit: writing it would evict the run's own head
                counts["disk_dropped_pages"] += len(todo) - j
                break
            budget -= size
            queued = disk.put(
                hashes[i], page_tokens, payload, meta, encoded=write, parent=hashes[i - 1] if i else parent
            )
        except Exception as exc:
            queued, failed = False, failed or exc
        counts["disk_queued_pages" if queued else "disk_dropped_pages"] += 1
    if failed is not None:
        log.error("disk KV cache: queueing a page failed; not written", exc_info=failed)
