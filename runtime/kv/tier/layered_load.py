"""Pages read from disk, copied into a request's new blocks layer by layer as its prefill reaches each layer.

Copying a long prefix's staged pages into the pool in one batch at admission put its whole cost in one engine step:
124 SmolLM2 pages (92 MB) took 6 ms into pool memory written before and 30 to 35 ms into memory never written (the
pool is committed as it is first written: runtime.md), beside the running decodes. A request whose first chunk is
staged by layers (model.staged) needs layer i of its prefix only when its chunk reaches layer i, so its load is
deferred (`KVTiers.load(defer=True)`) and each pass copies the layers it is about to run (`copy_until`): the copy
is spread over the same passes as the chunk. The pages are not in the tree until the chunk has run its last layer
(kv.manager.commit), so no other request reads a layer before it is copied; any path that gives the request's KV to
the tree (a preemption, a release) copies the rest first (`finish`), and a cancel drops it (`drop`). A copy that
raises is a failed read: the load is dropped and the request recomputes from before its disk pages
(kv.manager.KVManager.load_layers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.kv.tier.page_copy import copy_pages


class LayeredLoad:
    """`pages` staged pages (`staging`, `[layers, 2, pages, ...]`) bound for the pool's `blocks`, copied up to a
    layer at a time; `release` hands the staging memory back (called once, when the copy is done or dropped)."""

    def __init__(
        self, pool: KVPool, staging: torch.Tensor, pages: int, blocks: Sequence[int], release: Callable[[], None]
    ) -> None:
        self.pool = pool
        self.staging = staging
        self.pages = pages
        self.blocks = list(blocks[:pages])
        self.next_layer = 0
        self._release: Callable[[], None] | None = release

    @property
    def done(self) -> bool:
        return self.next_layer >= self.pool.num_layers

    def copy_until(self, stop: int | None) -> None:
        """Copy layers `[next_layer, stop)` (None: every layer left); once all are in, release the staging."""
        stop = self.pool.num_layers if stop is None else min(stop, self.pool.num_layers)
        if stop > self.next_layer and self._release is not None:
            first = self.next_layer
            copy_pages(self.pool.kv[first:stop], self.blocks, self.staging[first:stop], range(self.pages))
            self.next_layer = stop
        if self.done:
            self.drop()

    def finish(self) -> None:
        """Copy every layer left (before the request's pages can reach the tree)."""
        self.copy_until(None)

    def drop(self) -> None:
        """Hand the staging back without copying more (the request's blocks are freed, or every layer is in)."""
        release, self._release = self._release, None
        if release is not None:
            release()
