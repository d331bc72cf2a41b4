"""Eviction: the evictable set (a heap of the unlocked leaves, with lazy deletion) and the trimming walk.

`EvictableSet` is the ground layer of `RadixCache` (radixcache.cache): the tree walk (radixcache.walk), locking
(radixcache.locking) and the cache's public calls all run on the same object. The layers are base classes, not
helper objects, so a hot path pays no extra attribute lookup or call to cross from one layer to the next.

Invariants (checked by radixcache.invariants):
- The live entries of the heap, (priority, uid, seq, node) with `node.evict_key is entry`, are exactly the
  unlocked non-root leaves, one each. Every other entry is stale, and `_stale` counts them.
- `_evictable` counts the blocks of unlocked tree nodes, `_tree_locked` those of locked ones.
- Eviction takes blocks from the leaves in policy order, deepest first, and gives them straight to the free list.
  The policy's order decides what goes; this module only keeps that order cheap to read and to update.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Callable, Hashable
from heapq import heapify, heappop, heappush, heapreplace
from itertools import count

from radixcache.blocks import BlockPool, block_ids
from radixcache.errors import RadixCacheError
from radixcache.node import TreeNode
from radixcache.policy.base import EvictionPolicy
from radixcache.stats import StatsCounter


class EvictableSet:
    """The evictable leaves of the tree, in policy order, and the eviction that frees their blocks.

    The tree's shared state is set by `RadixCache.__init__`; the set's own by `_init_evictable_set`.
    """

    # The tree's state, read by every layer (set in RadixCache.__init__).
    page_size: int
    policy: EvictionPolicy
    _pool: BlockPool
    _roots: dict[Hashable, TreeNode]
    _stats: StatsCounter
    on_evict: Callable[[TreeNode, int, array], None] | None

    def _init_evictable_set(self) -> None:
        # The evictable set: a binary heap of entries (priority, uid, seq, node) with lazy deletion. A node's
        # live entry is `node.evict_key` (None while out of the set); any other entry is stale and is dropped
        # when it reaches the top, or by `_compact` once stale entries outnumber live ones. Live entries are
        # exactly the unlocked non-root leaves. `seq` is unique per entry, so a stale and a live entry of one
        # node with equal priorities still compare without reaching the node.
        self._evictable_leaves: list[tuple] = []
        self._stale = 0  # stale entries in the heap
        self._seq = count()
        self._evictable = 0  # blocks in unlocked tree nodes
        self._tree_locked = 0  # blocks in locked tree nodes

    # ------------------------------------------------------------------ public API

    def evict(self, n: int) -> int:
        """Free up to n blocks now from unlocked leaves, in policy order. Returns how many were freed."""
        return self._evict(self._count_arg(n, "evict"))

    @property
    def evictable_blocks(self) -> int:
        """Blocks in unlocked tree nodes: reclaimable by eviction."""
        return self._evictable

    # ------------------------------------------------------------------ private

    def _evict(self, n: int) -> int:
        p = self.page_size
        heap = self._evictable_leaves
        policy = self.policy
        policy_on_evict = policy.on_evict
        by_extent = policy.ranks_by_extent
        bulk = by_extent and policy.trims_in_bulk
        free = self._pool._free  # blocks leave the tree straight onto the free list (BlockPool.release_tree)
        on_evict = self.on_evict
        freed = evictions = 0
        while freed < n:
            while heap and heap[0][3].evict_key is not heap[0]:  # stale entries at the top: drop them
                heappop(heap)
                self._stale -= 1
            if not heap:
                break
            entry = heap[0]
            priority = entry[0]
            leaf = entry[3]
            policy_on_evict(leaf, priority)
            blocks = leaf.blocks
            size = len(blocks)
            evictions += 1
            if size > 1 and by_extent:
                # A policy that ranks a leaf by the blocks it holds (Belady): its deepest block goes alone, since
                # the new deepest one may be needed sooner than another leaf's; the leaf is re-ranked after each.
                # While its new rank still beats the best other entry (the smaller of the top's two children, live
                # or stale), it would be back on top at once: trim on, and update its entry once at the end. A
                # policy that `trims_in_bulk` finds that run in one binary search instead of block by block.
                uid = leaf.uid
                rest = heap[1] if len(heap) > 1 else None
                if len(heap) > 2 and heap[2] < rest:
                    rest = heap[2]
                if bulk:  # the same run of blocks, found by a binary search over the cut leaf's rank
                    take = self._bulk_trim(leaf, min(size - 1, n - freed), rest)
                    keep = size - take
                    if on_evict is not None:
                        on_evict(leaf, keep, blocks[keep:])
                    free.extend(blocks[: keep - 1 : -1])  # deepest first, as one block at a time would go
                    del blocks[keep:]
                    del leaf.key[keep * p :]
                    freed += take
                    evictions += take - 1
                    new_priority = policy.priority(leaf)
                else:
                    while True:
                        if on_evict is not None:
                            on_evict(leaf, size - 1, blocks[-1:])
                        free.append(blocks.pop())
                        size -= 1
                        del leaf.key[size * p :]
                        freed += 1
                        new_priority = policy.priority(leaf)
                        if size == 1 or freed >= n or (rest is not None and (new_priority, uid) >= rest[:2]):
                            break
                        evictions += 1
                        policy_on_evict(leaf, new_priority)
                if new_priority != priority:
                    entry = (new_priority, uid, next(self._seq), leaf)
                    leaf.evict_key = entry
                    heapreplace(heap, entry)  # the top entry out, the re-ranked one in: one sift
                continue
            if n - freed >= size:  # the whole leaf goes (the inlined _detach)
                if on_evict is not None:
                    on_evict(leaf, 0, blocks)
                heappop(heap)  # the entry just read
                leaf.evict_key = None
                freed += size
                parent = leaf.parent
                key = leaf.key
                children = parent.children
                del children[key[0] if p == 1 else key[:p].tobytes()]
                free.extend(blocks)
                leaf.parent = None  # marks the node as evicted: lock() refuses it
                leaf.blocks = block_ids()
                if not children:
                    if parent.parent is not None:
                        if parent.lock_ref == 0:  # an unlocked parent that just became a leaf
                            self._set_add(parent)
                    elif self._roots.get(parent.namespace) is parent:  # an empty namespace keeps no root
                        del self._roots[parent.namespace]
            else:  # trim the leaf's tail: the deepest tokens go, the rest stays cached
                keep = size - (n - freed)
                if on_evict is not None:
                    on_evict(leaf, keep, blocks[keep:])
                free.extend(blocks[keep:])
                # In place: a node's block list and key are its own (every one is a fresh list or slice), and
                # truncating costs only what goes, where a copy would cost what stays.
                del blocks[keep:]
                del leaf.key[keep * p :]
                freed = n
                # A trim is not an access: the leaf keeps its priority, unless the policy ranks a leaf by
                # the blocks it holds (Belady), where the new deepest block may be needed sooner.
                if by_extent and policy.priority(leaf) != priority:
                    heappop(heap)
                    self._set_add(leaf)
        self._evictable -= freed
        stats = self._stats
        stats.evictions += evictions
        stats.evicted_blocks += freed
        stats.evicted_tokens += freed * p
        return freed

    def _bulk_trim(self, leaf: TreeNode, limit: int, rest: tuple | None) -> int:
        """How many of `leaf`'s deepest blocks (1 to `limit`) go before it no longer ranks first: the fewest whose
        loss ranks it at or after `rest` (the best other entry), else `limit`. The policy's `priority_at` never
        decreases as the leaf is cut shorter, so the answer is a binary search."""
        if rest is None:
            return limit
        priority_at, uid, size, best = self.policy.priority_at, leaf.uid, len(leaf.blocks), rest[:2]
        lo, hi = 1, limit  # invariant: the answer is in [lo, hi]; hi == limit may mean "none reaches rest"
        while lo < hi:
            mid = (lo + hi) // 2
            if (priority_at(leaf, size - mid), uid) >= best:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _set_add(self, node: TreeNode) -> None:
        entry = (self.policy.priority(node), node.uid, next(self._seq), node)
        node.evict_key = entry
        heap = self._evictable_leaves
        heappush(heap, entry)
        if self._stale * 2 > len(heap):
            self._compact()

    def _set_discard(self, node: TreeNode) -> None:
        node.evict_key = None  # its entry goes stale
        self._stale += 1

    def _compact(self) -> None:
        """Drop every stale entry: O(heap), run once stale entries outnumber live ones, so O(1) amortised."""
        heap = self._evictable_leaves  # in place: `_evict` holds a reference to this list
        heap[:] = [entry for entry in heap if entry[3].evict_key is entry]
        heapify(heap)
        self._stale = 0

    def _evictable_entries(self) -> list[tuple]:
        """The live entries of the evictable set, in no particular order: for checks, not hot paths."""
        return [entry for entry in self._evictable_leaves if entry[3].evict_key is entry]

    @staticmethod
    def _count_arg(n: int, what: str) -> int:
        """Validate a block count: an int (or an __index__ object, e.g. numpy's), never a bool or float, >= 0."""
        try:
            if type(n) is bool:  # an int to operator.index, but never a block count (allocate(True) took one)
                raise TypeError
            n = operator.index(n)
        except TypeError:
            raise RadixCacheError(f"{what}: block count must be an int, got {n!r}") from None
        if n < 0:
            raise RadixCacheError(f"{what}: block count must be >= 0, got {n}")
        return n
