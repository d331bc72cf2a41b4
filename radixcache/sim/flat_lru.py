"""LRU over a hash trace's blocks without the tree, with the tree's figures, streamed, in numpy.

At concurrency 1 every request touches one path from the root: its match stamps the matched blocks, its insert
stamps the whole path (the insert's tick), and the tree evicts the leaf stamped longest ago, trimming it from its
deepest block. In a chained-hash trace (each id always follows the same parent, so an id names its whole prefix) a
block is stamped whenever any of its descendants is, so the block stamped longest ago, deeper first on a tie, never
has cached children: the tree's eviction order is the order of the blocks' last accesses, a request's path read
deepest first. Lay every access out in that order, one position each ("events"): the cache then holds the blocks
whose last access is among the `capacity` most recent, which is a position threshold `theta`:

- a block is cached before a request iff its previous access (`prev`) is at or after `theta`; along a path the
  previous accesses never increase with depth, so a request's hits are the blocks of its path with `prev >= theta`;
- a request adds `len(path) - hits` blocks; when that overfills the cache, `theta` moves past that many live events
  (an event is live until its block is accessed again), which evicts exactly the blocks the tree evicts.

Everything except the move of `theta` is computed for a chunk of requests at once: the events' ids, previous and
next accesses (a stable sort by id within the chunk, and a sorted table of the ids whose last access may still be
cached), and the chain check. Memory is the cache's window (the ids and events since `theta`), not the trace's.

A request the tree must replay (a namespace, a recorded finish or tail page), an id found after two different
parents or twice in one path, or an id that is not a non-negative int64 marks the replay `broken`: it stops
counting, and the caller replays the trace through the tree instead (radixcache.sim.simulation). It gives the
tree's hits, evictions and windows exactly (tests/sim/test_flat_lru.py).
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_left
from typing import Any

import numpy as np

from radixcache.trace.workload import SimRequest

_ROOT = -1  # the parent of a path's first id


class FlatLRUReplay:
    """LRU over single blocks (see the module docstring), fed request by request like CacheReplay; it keeps
    CacheReplay's counters, which radixcache.sim.simulation reads into a SimResult. `broken` says the tree must replay
    the trace instead (`reason` says why)."""

    def __init__(
        self, workload: Any, capacity_blocks: int, *, timeline: Any, honor_timestamps: bool, chunk_ids: int = 1 << 14
    ) -> None:
        self.capacity_blocks = capacity_blocks
        self.page_size, self.block_tokens = workload.page_size, workload.block_tokens
        self.concurrency = 1
        self.honor_timestamps = honor_timestamps  # LRU's order is the requests' order either way: only a label
        self.timeline = timeline
        self.prompt_blocks = self.hit_blocks = self.oversized = self.evicted = 0
        self.seconds = 0.0
        self.broken = False
        self.reason = ""
        self.cached = 0  # blocks cached between requests
        self.theta = 0  # position of the oldest event that may still be cached
        self.now = 0  # position of the next event
        # The events from `base` on: 1 where the event is dead (its block was accessed again since).
        self.base = 0
        self.dead = bytearray()
        # Ids whose last access may be cached, sorted: (id, position of its last access, its parent).
        self.table_ids = np.empty(0, dtype=np.int64)
        self.table_last = np.empty(0, dtype=np.int64)
        self.table_parent = np.empty(0, dtype=np.int64)
        # The chunk being gathered: the requests, and their ids (at most `capacity_blocks` of each) one after another.
        self.ids = array("q")
        self.requests: list[SimRequest] = []
        # Ids per chunk: at least `chunk_ids`, and half the table, so that the table's upkeep is amortised.
        self.chunk_ids = self.chunk_size = chunk_ids

    def feed(self, index: int, request: SimRequest) -> None:
        if self.broken:
            return
        started = time.perf_counter()
        if request.namespace is not None or request.finish_ms is not None or request.holds_tail or request.output:
            self._break("a request with a namespace, a recorded finish or output replays through the tree")
            return
        prompt = request.prompt
        try:
            self.ids.extend(prompt if len(prompt) <= self.capacity_blocks else prompt[: self.capacity_blocks])
        except (OverflowError, TypeError):
            self._break("an id that is not an int64 replays through the tree (which says what is wrong with it)")
            return
        self.requests.append(request)
        if len(self.ids) >= self.chunk_size:
            self._run_chunk()
        self.seconds += time.perf_counter() - started

    def close(self) -> None:
        if not self.broken and self.requests:
            started = time.perf_counter()
            self._run_chunk()
            self.seconds += time.perf_counter() - started

    def _break(self, reason: str) -> None:
        self.broken, self.reason = True, reason
        self.ids, self.requests = array("q"), []

    # ------------------------------------------------------------------ one chunk of requests

    def _run_chunk(self) -> None:
        capacity = self.capacity_blocks
        sizes = [len(request.prompt) for request in self.requests]
        lengths = np.minimum(np.array(sizes, dtype=np.int64), capacity)  # an oversized request caches what fits
        path_ids = np.frombuffer(self.ids, dtype=np.int64) if len(self.ids) else np.empty(0, dtype=np.int64)
        if (path_ids < 0).any():
            self._break("a negative id replays through the tree (which refuses it)")
            return
        count = len(path_ids)
        starts = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
        offset = np.arange(count, dtype=np.int64) - starts[owner]  # depth - 1 within the path
        # Each id's parent, in path order; then the events in LRU order: each path deepest first.
        parents = np.empty(count, dtype=np.int64)
        parents[1:] = path_ids[:-1]
        parents[offset == 0] = _ROOT
        order_in_path = starts[owner] + (lengths[owner] - 1 - offset)
        ids, parents, owner = path_ids[order_in_path], parents[order_in_path], owner[order_in_path]
        positions = self.now + np.arange(count, dtype=np.int64)

        by_id = np.argsort(ids, kind="stable")  # each id's events together, in position order
        sorted_ids = ids[by_id]
        same = sorted_ids[1:] == sorted_ids[:-1]
        if (same & (owner[by_id[1:]] == owner[by_id[:-1]])).any():
            self._break("an id twice in one request's path: ids that are not chained replay through the tree")
            return
        if (same & (parents[by_id[1:]] != parents[by_id[:-1]])).any():
            self._break("an id after two different parents: ids that are not chained replay through the tree")
            return
        prev = np.full(count, -1, dtype=np.int64)
        prev[by_id[1:][same]] = positions[by_id[:-1][same]]
        first = np.ones(count, dtype=bool)
        first[1:] = ~same
        last = np.ones(count, dtype=bool)
        last[:-1] = ~same
        firsts = by_id[first]  # each id's first event in the chunk: its previous access is in the table, if any
        if not self._look_up(ids[firsts], parents[firsts], firsts, prev):
            return
        self.now += count
        hits = self._replay(prev, lengths.tolist(), sizes)
        lasts = by_id[last]
        self._update_table(ids[lasts], positions[lasts], parents[lasts])
        self.chunk_size = max(self.chunk_ids, len(self.table_ids) // 2)
        requests = self.requests
        self.ids, self.requests = array("q"), []
        self.timeline.add_many(
            [request.timestamp_ms for request in requests],
            [request.prompt_tokens for request in requests],
            [hit * request.unit for hit, request in zip(hits, requests, strict=True)],
        )

    def _look_up(self, ids: Any, parents: Any, events: Any, prev: Any) -> bool:
        """Set `prev` of each id's first event in the chunk from the table and check its parent. False (and broken)
        where a parent differs."""
        table_ids = self.table_ids
        if not len(table_ids):
            return True
        at = np.searchsorted(table_ids, ids)
        at[at == len(table_ids)] = 0
        found = table_ids[at] == ids
        where = at[found]
        if (self.table_parent[where] != parents[found]).any():
            self._break("an id after two different parents: ids that are not chained replay through the tree")
            return False
        prev[events[found]] = self.table_last[where]
        return True

    def _replay(self, prev: Any, lengths: list[int], sizes: list[int]) -> list[int]:
        """The requests of the chunk in order: hits from `theta`, then `theta` past the evicted blocks. Returns each
        request's hits (in blocks)."""
        capacity, cached, base, dead = self.capacity_blocks, self.cached, self.base, self.dead
        theta = self.theta - base  # positions from here on are relative to `base`, the ring's first event
        dead.extend(bytes(len(prev)))
        # Previous accesses (relative to base), in position order: along a path, deepest first, they never decrease.
        prevs = (prev - base).tolist()
        hits_of: list[int] = []
        start = evicted = 0  # start: the request's first event, as an index into the chunk
        for length in lengths:
            end = start + length
            hits = end - bisect_left(prevs, theta, start, end)
            for i in range(end - hits, end):  # re-stamped by this request: its old events leave the LRU order
                dead[prevs[i]] = 1
            cached += length - hits
            if cached > capacity:
                # Evict: theta moves past `cached - capacity` live events. Each round counts the dead events in the
                # stretch it passes, which is how many live ones it still owes.
                owed = cached - capacity
                evicted += owed
                cached = capacity
                while owed:
                    passed = dead.count(1, theta, theta + owed)
                    theta += owed
                    owed = passed
            hits_of.append(hits)
            start = end
        self.prompt_blocks += sum(sizes)
        self.hit_blocks += sum(hits_of)
        self.evicted += evicted
        self.oversized += sum(size > capacity for size in sizes)
        self.cached, self.theta = cached, theta + base
        if theta > len(dead) // 2:  # drop the events before theta: none is cached
            del dead[:theta]
            self.base = theta + base
        return hits_of

    def _update_table(self, ids: Any, last: Any, parents: Any) -> None:
        """Record each id's last access (ids sorted, each once), and drop the ids whose last access is before
        `theta` (no longer cached: their next access misses whatever it finds)."""
        table_ids = self.table_ids
        at = np.searchsorted(table_ids, ids)
        inside = at < len(table_ids)
        found = np.zeros(len(ids), dtype=bool)
        found[inside] = table_ids[at[inside]] == ids[inside]
        self.table_last[at[found]] = last[found]
        new = ~found
        keep_ids = np.insert(table_ids, at[new], ids[new])
        keep_last = np.insert(self.table_last, at[new], last[new])
        keep_parent = np.insert(self.table_parent, at[new], parents[new])
        live = keep_last >= self.theta
        self.table_ids, self.table_last, self.table_parent = keep_ids[live], keep_last[live], keep_parent[live]
