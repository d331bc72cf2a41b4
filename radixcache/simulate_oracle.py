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
from typing import TYPE_CHECKING

from radixcache.policies import EvictionPolicy
from radixcache.simulate_workload import Workload

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
            full = request.prompt + request.output
            prompt_pages = len(request.prompt) // p
            ids = array("q")
            for k in range(len(full) // p):
                key = (parent, full[k]) if p == 1 else (parent, full[k * p : (k + 1) * p])
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
        self.block_page = array("q", [-1]) * capacity_blocks
        self.now = 0

    def assign(self, blocks: list[int], request: int, first_page: int) -> None:
        """Blocks allocated for request `request`, holding its pages first_page, first_page+1, ..."""
        ids = self.pages[request]
        block_page = self.block_page
        for offset, block in enumerate(blocks):
            page = first_page + offset
            if page < len(ids):
                block_page[block] = ids[page]

    def next_use(self, node: TreeNode) -> int:
        """Index of the next request (after `now`) whose prompt reads the node's deepest block."""
        lid = self.block_page[node.blocks[-1]]
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

    def __init__(self, oracle: NextUseOracle) -> None:
        self.oracle = oracle

    def priority(self, node: TreeNode) -> tuple:
        return (self.oracle.next_use(node) < self.oracle.never, node.last_access)
