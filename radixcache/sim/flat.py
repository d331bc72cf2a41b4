"""Belady over a hash trace's blocks without the tree, with the tree's figures, in a fraction of the time.

A replay of a hash trace at concurrency 1 (the default) runs one request at a time, and every request touches one
path from the root: the blocks it matches, then the blocks it inserts. The tree's Belady evicts the leaf whose
deepest block is read again farthest ahead, trimming it from that block. In a chained-hash trace (each id always
follows the same parent, so an id names its whole prefix) a block is read whenever any of its descendants is, so it
is never read later than they are. The block read farthest ahead, deeper first on a tie (blocks read by the same
request lie on one path), is therefore always one without cached children, and evicting blocks in that order over
all cached blocks is what the tree does leaf by leaf. A heap holds the next reads of the cached blocks that may be
evicted first (the leaves: see `FlatBeladyReplay._complete`), from the chained oracle's flat arrays; a block's entry
is replaced when a request reads it (the old one goes stale), and when a leaf goes, its parent follows at once while
it ranks before the whole heap, else joins it. A block no later request reads skips the heap for a plain list: all of
those go before any live block, in any order.

It gives the tree's hits, evictions and windows exactly (tests/sim/test_flat_replay.py checks them against the tree
on generated and real traces), and skips what the tree keeps for policies in general (nodes, locks, splits, a heap
of leaves re-ranked by extent): 12.5 s of replay on the 500,000-request hash trace, against 45.8 for the tree.
`flat_replay` says when it applies: a trace an engine recorded (finish times, output pages) keeps the tree. The flat
replay reads the trace once, into the oracle's arrays and a few per-request columns, and replays from them without a
second pass (`run`).

LRU over single blocks is radixcache.sim.flat_lru: it needs no look-ahead and streams.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Any

from radixcache.sim.flat_lru import FlatLRUReplay
from radixcache.sim.oracle import ChainedArrays, chained_arrays

if TYPE_CHECKING:
    from radixcache.trace.workload import SimRequest


def flat_replay(
    workload: Any,
    capacity_blocks: int,
    policy: object,
    *,
    concurrency: int,
    timeline: Callable[[], Any],
    honor_timestamps: bool,
) -> FlatBeladyReplay | FlatLRUReplay | None:
    """A flat replay of `workload` at `policy`, when one gives the tree's figures: policy "belady" or "lru" on a hash
    trace (one page per id) of chained ids, without namespaces or requests an engine recorded, one request at a time.
    None otherwise. The caller handles admission, tiers and checks (none of which run flat). `timeline()` makes the
    time windows it fills.

    Belady reads the trace once, here; `run` then replays from what it read. LRU streams (radixcache.sim.flat_lru):
    it is fed like CacheReplay, and says `broken` when the trace turns out to need the tree after all (ids that are
    not chained, a recorded request), for the caller to replay it through the tree instead."""
    if type(concurrency) is not int or concurrency != 1 or getattr(workload, "kind", None) != "hash":
        return None
    # Flat replays keep the capacity in int64 arrays (a float was a numpy TypeError, True a capacity, a size past
    # int64 an OverflowError) and took concurrency True for 1: the tree's replay takes any positive int, and refuses
    # anything else by name.
    if type(capacity_blocks) is not int or not 1 <= capacity_blocks < 2**63 or workload.page_size != 1:
        return None
    if policy == "lru":
        return FlatLRUReplay(workload, capacity_blocks, timeline=timeline(), honor_timestamps=honor_timestamps)
    if policy != "belady":
        return None
    arrays = chained_arrays(workload, columns=True)
    if arrays is None or arrays.recorded or not _entries_fit(arrays):
        return None
    return FlatBeladyReplay(workload, capacity_blocks, arrays, timeline=timeline(), honor_timestamps=honor_timestamps)


class FlatBeladyReplay:
    """Belady over single blocks (see the module docstring), from the trace's ChainedArrays: `run` replays every
    request; `feed` replays one (CacheReplay's interface: the request itself adds nothing to what was read). It
    keeps CacheReplay's counters, which radixcache.sim.simulation reads into a SimResult."""

    def __init__(
        self, workload: Any, capacity_blocks: int, arrays: ChainedArrays, *, timeline: Any, honor_timestamps: bool
    ) -> None:
        import numpy as np

        self.capacity_blocks = capacity_blocks
        self.page_size, self.block_tokens = workload.page_size, workload.block_tokens
        self.concurrency = 1
        self.honor_timestamps = honor_timestamps  # Belady's order ignores the clock: only the result's label
        self.timeline = timeline
        self.prompt_blocks = self.hit_blocks = self.oversized = self.evicted = 0
        self.cached = 0  # blocks held, the running request's included
        self.seconds = 0.0
        self.requests = len(arrays.offsets) - 1
        self.offsets = memoryview(arrays.offsets)
        self.pages = arrays.pages
        self.timestamps, self.prompt_tokens, self.units = arrays.timestamps, arrays.prompt_tokens, arrays.units
        # Each occurrence's heap entry, (next read, depth, page) as one int so that the heap compares ints, negated
        # because heapq pops the smallest and the block to evict has the largest next read, then the largest depth.
        # Computed for the whole trace at once, in int64 (`_entries_fit`).
        pages, offsets = arrays.pages, arrays.offsets
        self.page_span, depths = _spans(arrays)
        lengths = offsets[1:] - offsets[:-1]
        depth = np.arange(len(pages), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
        self.tops = -((arrays.next_read * depths + depth) * self.page_span + pages)
        # A page no later request reads goes to `dead`, not the heap: every dead page is evicted before any live one
        # (its next read is "never"), and which dead page goes first changes no hit, so they leave in bulk.
        self.live = arrays.next_read != arrays.never
        # Each page's parent page (-1: the root), for the heap's leaves (see `_complete`).
        parents = np.empty(len(pages), dtype=np.int64)
        parents[1:] = pages[:-1]
        parents[offsets[:-1][lengths > 0]] = -1
        parent_page = np.full(self.page_span, -1, dtype=np.int64)
        parent_page[pages] = parents  # one parent per page: the trace is chained (chained_arrays checked it)
        self.parent_page = array("q", parent_page.tobytes())
        self.entry: dict[int, int | None] = {}  # cached page -> its live heap entry (None: dead)
        self.heap: list[int] = []
        self.dead: list[int] = []
        self.pending: tuple | None = None

    def run(self, progress: Callable[[int], None] | None = None) -> None:
        """Replay every request; `progress(n)` now and then with the requests replayed since its last call."""
        step = self._step
        for index in range(self.requests):
            step(index)
            if progress is not None and index % 256 == 255:
                progress(256)
        self.close()
        if progress is not None and self.requests % 256:
            progress(self.requests % 256)

    def feed(self, index: int, request: SimRequest) -> None:
        self._step(index)

    def _step(self, index: int) -> None:
        started = time.perf_counter()
        if self.pending is not None:
            self._complete()
        a, b = self.offsets[index], self.offsets[index + 1]
        pages = self.pages[a:b].tolist()
        entry = self.entry
        cached = list(map(entry.__contains__, pages))
        try:
            matched = cached.index(False)
        except ValueError:
            matched = b - a
        # Blocks it inserts: all it does not match, or as many as the cache can free (its matched path is in use).
        need = b - a - matched
        room = self.capacity_blocks - matched
        if need > room:
            self.oversized += 1
            need = room
        evict = self.cached + need - self.capacity_blocks
        if evict > 0:
            # The matched pages are read now, so their entries hold the smallest next reads in the heap (every other
            # cached page is read later): `need` is at most what the rest holds, so eviction never reaches them.
            heap, span, dead = self.heap, self.page_span, self.dead
            self.evicted += evict
            self.cached -= evict
            if dead:
                gone = dead[-evict:]
                del dead[-evict:]
                for _ in map(entry.__delitem__, gone):
                    pass
                evict -= len(gone)
            parent_page = self.parent_page
            while evict:
                top = heappop(heap)
                page = -top % span
                if entry.get(page) != top:  # stale: the page was read again, or evicted, since
                    continue
                del entry[page]
                evict -= 1
                # Its parent may have become a leaf (see `_complete`). While the parent ranks before every heap entry
                # it has no live cached descendant (that one's entry would rank first), so it goes now, without the
                # heap; the first one that does not rank first joins the heap.
                parent = parent_page[page]
                while parent >= 0:
                    above = entry[parent]  # cached and live: its live child was
                    if evict and (not heap or above < heap[0]):
                        del entry[parent]
                        evict -= 1
                        parent = parent_page[parent]
                    else:
                        heappush(heap, above)
                        break
        self.cached += need
        end = a + matched + need
        self.pending = (pages[: matched + need], self.tops[a:end].tolist(), self.live[a:end].tolist())
        self.prompt_blocks += b - a
        self.hit_blocks += matched
        tokens = self.prompt_tokens[index]  # type: ignore[index]
        hit = matched * self.units[index]  # type: ignore[index]
        self.timeline.add(self.timestamps[index], tokens, hit if hit < tokens else tokens)  # type: ignore[index]
        self.seconds += time.perf_counter() - started

    def _complete(self) -> None:
        """The running request finishes: each page of its path is ranked by its next read after this request.

        Only leaves (live pages without live cached children) need be in the heap: a page is read whenever any of
        its descendants is, so a descendant's entry pops first, and entries of pages that are not leaves are
        harmless. The path's live pages are a prefix of it (a dead page's descendants are dead), and every one but
        the deepest has a live child on the path, so the deepest is the one this request adds; a page whose last
        live child is evicted joins when it is (`_step`)."""
        pages, tops, live = self.pending  # type: ignore[misc]
        self.pending = None
        entry, heap = self.entry, self.heap
        if all(live):
            entry.update(zip(pages, tops, strict=True))
        else:
            keep = live.index(False)
            entry.update(zip(pages[:keep], tops[:keep], strict=True))
            gone = pages[keep:]
            entry.update(dict.fromkeys(gone))
            self.dead += gone
            tops = tops[:keep]
        if tops:
            heappush(heap, tops[-1])
        if len(heap) > 4 * len(entry) + 4096:  # stale entries (pages read again, evicted or dead) outnumber live ones
            heap[:] = [top for top in entry.values() if top is not None]
            heapify(heap)

    def close(self) -> None:
        if self.pending is not None:
            self._complete()


def _spans(arrays: ChainedArrays) -> tuple[int, int]:
    """(pages, depths): one more than the largest page number and than the longest prompt."""
    pages, offsets = arrays.pages, arrays.offsets
    lengths = offsets[1:] - offsets[:-1]
    return (int(pages.max()) + 1 if len(pages) else 1, int(lengths.max()) + 1 if len(lengths) else 1)


def _entries_fit(arrays: ChainedArrays) -> bool:
    """Whether every heap entry fits an int64; a trace too large for that (billions of ids) keeps the tree."""
    span, depths = _spans(arrays)
    return (arrays.never + 1) * depths * span < 1 << 62
