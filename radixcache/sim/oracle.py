"""The oracle behind Belady's policy: for a cached block, the next request that will read it.

Every distinct page of the trace (a prefix: the same tokens after the same path) gets a logical page id, from a
trie built over the whole trace up front. The simulator tells the oracle which logical page each block it
allocates will hold, and which request it is replaying; the oracle then answers, for a tree leaf, when its
deepest block is next read by a prompt. In a prefix tree a block is never read later than its descendants,
so the deepest block of a leaf is the one that matters.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from radixcache.policy.base import EvictionPolicy
from radixcache.trace.workload import Workload

if TYPE_CHECKING:
    from radixcache.node import TreeNode


class NextUseOracle:
    """Logical page ids of every request, and the prompts that read each page.

    `pages[i]` lists the logical ids of request i's inserted full pages (prompt then output); `reads[lid]` the
    ascending indices of requests whose prompt holds that page in full. `now` is the request being replayed.
    """

    def __init__(self, workload: Workload, capacity_blocks: int) -> None:
        p = workload.page_size
        trie: dict[tuple, int] = {}
        roots: dict[object, int] = {}
        reads: list[list[int]] = []
        pages: list[array] = []
        count = 0
        for index, request in enumerate(workload):
            count += 1
            parent = roots.setdefault(request.namespace, -1 - len(roots))
            full = request.prompt + request.output if request.output else request.prompt
            prompt_pages = len(request.prompt) // p
            ids = array("q")
            for k in range(len(full) // p):
                key = (parent, full[k]) if p == 1 else (parent, tuple(full[k * p : (k + 1) * p]))
                lid = trie.get(key)
                if lid is None:
                    lid = trie[key] = len(reads)
                    reads.append([])
                if k < prompt_pages:
                    reads[lid].append(index)
                ids.append(lid)
                parent = lid
            pages.append(ids)
        self.pages = pages
        self.reads = reads
        self.never = count + 1  # "next use" of a page no later request reads
        # Block id -> logical page (-1: none), grown as `assign` meets higher ids: a cache hands out ids from 0 up,
        # so this grows with the blocks used, not the capacity (sized to it, 1e9 blocks was 8 GB up front).
        self.block_page = array("q")
        self.now = 0

    def hold_blocks(self, count: int) -> None:
        """Make room for a cache of `count` blocks (the admission bound's, with room for requests in flight): the
        map grows as blocks are assigned, whatever the count. Forgets every assignment."""
        self.block_page = array("q")

    def assign(self, blocks: Sequence[int], request: int, first_page: int) -> None:
        """Blocks allocated for request `request`, holding its pages first_page, first_page+1, ..."""
        ids = self.pages[request]
        block_page = self.block_page
        if len(blocks) and max(blocks) >= len(block_page):  # every block allocated gets an entry, -1 if no page
            block_page.extend(array("q", [-1]) * max(max(blocks) + 1 - len(block_page), len(block_page)))
        for offset, block in enumerate(blocks):
            page = first_page + offset
            if page < len(ids):
                block_page[block] = ids[page]

    def next_use(self, node: TreeNode) -> int:
        """Index of the next request (after `now`) whose prompt reads the node's deepest block."""
        return self.next_use_of_block(node.blocks[-1])

    def next_use_of_block(self, block: int) -> int:
        """Index of the next request (after `now`) whose prompt reads the page `block` holds."""
        lid = self.block_page[block]
        reads = self.reads[lid] if lid >= 0 else ()
        i = bisect_right(reads, self.now)
        return reads[i] if i < len(reads) else self.never


class DeadBlockLRU(EvictionPolicy):
    """LRU told which blocks no later request reads: those go first. A diagnostic bound, not a policy to run.

    It separates what an online policy could gain by predicting dead blocks (the best it can do with a
    perfect predictor) from what Belady gains by knowing when each live block returns.
    """

    name = "lru-dead"
    ranks_by_extent = True  # whether a leaf is dead depends on the blocks it still holds
    trims_in_bulk = True  # a leaf cut shorter is never more dead: its new deepest block is read no later

    def __init__(self, oracle: NextUseOracle | ChainedNextUseOracle) -> None:
        self.oracle = oracle

    def priority(self, node: TreeNode) -> tuple:
        return (self.oracle.next_use(node) < self.oracle.never, node.last_access)

    def priority_at(self, node: TreeNode, blocks: int) -> tuple:
        return (self.oracle.next_use_of_block(node.blocks[blocks - 1]) < self.oracle.never, node.last_access)


class ChainedNextUseOracle:
    """The same answers as NextUseOracle for a hash trace whose ids are chained hashes (each id follows one
    parent throughout: an id is its whole prefix), from flat arrays instead of a trie of Python objects.

    One pass reads every prompt's ids into one int64 array. Sorting it (stably, so occurrences of an id stay in
    request order) gives each occurrence the next request that reads the same id, and each id a dense page
    number. Replaying request i first sets, for each of its ids, `page_next[page]` to the next request after i
    that reads it: at any moment, a cached page's entry is the next read after now, which is what Belady needs.
    About 40 bytes per prompt id while it is built (numpy sorts), 24 while it runs. Build it with
    `ChainedNextUseOracle.build`, which returns None for a trace whose ids are not chained (then NextUseOracle,
    exact for any trace, applies).
    """

    def __init__(self, offsets: Any, pages: Any, next_read: Any, capacity_blocks: int, never: int) -> None:
        import numpy as np

        # Written a request at a time by numpy's scatter (`now`, `assign`: one C call each), read one entry at a
        # time through memoryviews (`next_use`): the policy asks a million times per 50,000 requests, and indexing
        # a memoryview returns a plain int several times faster than indexing numpy does.
        self._np = np
        self.offsets = memoryview(offsets)
        self.pages = pages
        self.next_read = next_read
        self.never = never
        self._page_next = np.full(int(pages.max()) + 1 if len(pages) else 1, never, dtype=np.int64)
        self.page_next = memoryview(self._page_next)
        self.hold_blocks(capacity_blocks)
        self._now = 0

    def hold_blocks(self, count: int) -> None:
        """Make room for a cache of `count` blocks (see NextUseOracle.hold_blocks). Forgets every assignment."""
        self._block_page = self._np.full(0, -1, dtype=self._np.int64)
        self.block_page = memoryview(self._block_page)

    @classmethod
    def build(cls, workload: Any, capacity_blocks: int) -> ChainedNextUseOracle | None:
        arrays = chained_arrays(workload)
        if arrays is None:
            return None
        return cls(arrays.offsets, arrays.pages, arrays.next_read, capacity_blocks, arrays.never)

    @property
    def now(self) -> int:
        return self._now

    @now.setter
    def now(self, index: int) -> None:
        """Request `index` is being replayed: each of its pages is next read by the next request that reads it."""
        self._now = index
        a, b = self.offsets[index], self.offsets[index + 1]
        self._page_next[self.pages[a:b]] = self.next_read[a:b]

    def assign(self, blocks: Sequence[int], request: int, first_page: int) -> None:
        """Blocks allocated for request `request`, holding its pages first_page, first_page+1, ..."""
        if not len(blocks):
            return
        top = int(max(blocks)) + 1
        if top > len(self._block_page):  # grown as NextUseOracle's is: with the blocks used, doubling
            more = self._np.full(max(top - len(self._block_page), len(self._block_page)), -1, dtype=self._np.int64)
            self._block_page = self._np.concatenate((self._block_page, more))
            self.block_page = memoryview(self._block_page)
        a = self.offsets[request] + first_page
        b = min(a + len(blocks), self.offsets[request + 1])
        self._block_page[blocks[: b - a]] = self.pages[a:b]  # to the shorter of the two

    def next_use(self, node: TreeNode) -> int:
        """Index of the next request (after `now`) whose prompt reads the node's deepest block."""
        page = self.block_page[node.blocks[-1]]
        return self.page_next[page] if page >= 0 else self.never

    def next_use_of_block(self, block: int) -> int:
        """Index of the next request (after `now`) whose prompt reads the page `block` holds."""
        page = self.block_page[block]
        return self.page_next[page] if page >= 0 else self.never


class ChainedArrays(NamedTuple):
    """A chained-hash trace read once into flat arrays (`chained_arrays`). Request i's prompt ids are occurrences
    offsets[i] to offsets[i + 1]; each occurrence has its id's dense page number and the next request whose prompt
    reads that id (`never` if none). With `columns`, also what each request's replay counts: its arrival time, its
    real prompt tokens and tokens per block, and whether any request was recorded by an engine (`recorded`: a
    finish time or a held page)."""

    offsets: Any
    pages: Any
    next_read: Any
    never: int
    timestamps: array | None = None
    prompt_tokens: array | None = None
    units: array | None = None
    recorded: bool = False


def chained_arrays(workload: Any, *, columns: bool = False) -> ChainedArrays | None:
    """Read `workload` once into ChainedArrays; None unless its page size is 1, it has no namespaces and no
    recorded outputs, and every id follows one parent throughout (about 40 bytes per prompt id while sorting)."""
    import numpy as np

    if workload.page_size != 1:
        return None
    ids = array("q")
    lengths = array("q")
    timestamps, prompt_tokens, units = array("d"), array("q"), array("q")
    recorded = False
    for request in workload:
        if request.namespace is not None or request.output:
            return None  # namespaces and recorded outputs: the general oracle
        ids.extend(request.prompt)
        lengths.append(len(request.prompt))
        if columns:
            timestamps.append(request.timestamp_ms)
            prompt_tokens.append(request.prompt_tokens)
            units.append(request.unit)
            recorded = recorded or request.finish_ms is not None or request.holds_tail
    flat = np.frombuffer(ids, dtype=np.int64) if len(ids) else np.zeros(0, dtype=np.int64)
    counts = np.frombuffer(lengths, dtype=np.int64) if len(lengths) else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    order = np.argsort(flat, kind="stable")
    sorted_ids = flat[order]
    parents = np.empty_like(flat)  # the id before each occurrence; -1 at a request's start (the root)
    parents[1:] = flat[:-1]
    parents[offsets[:-1][counts > 0]] = -1
    same = sorted_ids[1:] == sorted_ids[:-1]
    sorted_parents = parents[order]
    del parents
    if bool(np.any(same & (sorted_parents[1:] != sorted_parents[:-1]))):
        return None  # an id after two parents: not a chained-hash trace
    del sorted_parents
    never = len(counts) + 1
    requests = np.repeat(np.arange(len(counts), dtype=np.int64), counts)[order]
    following = np.full(len(flat), never, dtype=np.int64)
    following[:-1][same] = requests[1:][same]
    del requests
    next_read = np.empty_like(following)
    next_read[order] = following
    del following
    dense = np.empty(len(flat), dtype=np.int64)
    dense[order] = np.concatenate(([0], np.cumsum(~same))) if len(flat) else dense
    del order, sorted_ids, same
    if not columns:
        return ChainedArrays(offsets, dense, next_read, never)
    return ChainedArrays(offsets, dense, next_read, never, timestamps, prompt_tokens, units, recorded)
