"""RadixCache: a radix tree over token ids whose nodes own KV block ids, with pluggable eviction.

The tree holds integers only. Whoever owns the KV memory (the runtime, or the simulator) indexes it by the
block ids handed out here. The cache is not thread-safe: one scheduler thread drives it.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Callable, Hashable, Iterator, Sequence
from heapq import heapify, heappop, heappush, heapreplace
from itertools import count
from typing import NamedTuple

from radixcache.blocks import STATE_NAMES, BlockPool, as_block_ids, block_ids
from radixcache.errors import (
    BlockCountError,
    BlockStateError,
    CacheFullError,
    InvalidTokensError,
    LockError,
    RadixCacheError,
)
from radixcache.node import TreeNode, empty_key, new_node_ids
from radixcache.policy.base import EvictionPolicy
from radixcache.policy.registry import make_policy
from radixcache.stats import CacheStats, StatsCounter
from radixcache.tokens import (
    TOKEN_TYPECODE,
    as_token_array,
    check_signs,
    common_prefix_length,
    negative_token,
    token_view,
)


class MatchResult(NamedTuple):
    """The longest cached prefix of a query.

    length: leading tokens cached (a multiple of page_size). blocks: one block id per page of those tokens, as
    an int64 array (array('q'): `list(blocks)` for a list; `blocks + allocate(n)` is the insert's block array).
    node: the deepest matched node, to pass to lock/unlock (a namespace root when nothing matched; locking a
    root is a no-op). A `peek`'s node is for identity only, never to lock: see `RadixCache.peek`.
    """

    length: int
    blocks: array
    node: TreeNode


# What _descend finds: (node, length, blocks, partial, partial_len), a plain tuple on the hot path.
#   node: the deepest node matched in full; length: tokens matched down to its end; blocks: their block ids;
#   partial: the child matched only in part, if any; partial_len: its tokens matched (page-aligned, > 0 when set).
_Descent = tuple[TreeNode, int, array, "TreeNode | None", int]
_new_match = tuple.__new__


class RadixCache:
    """A prefix cache of KV blocks keyed by token ids.

    Block accounting: every block id is free, evictable (in an unlocked tree node), or locked (in a locked
    tree node, or held by a caller between `allocate` and `insert`/`free`), and
    `free_blocks + evictable_blocks + locked_blocks == capacity_blocks` always.

    A MatchResult's blocks stay valid only while its node is locked: lock before any call that may evict
    (`allocate`, `evict`).
    """

    # ------------------------------------------------------------------ construction

    def __init__(self, capacity_blocks: int, page_size: int = 1, policy: str | EvictionPolicy = "lru") -> None:
        if type(capacity_blocks) is not int or capacity_blocks < 1:
            raise RadixCacheError(f"capacity_blocks must be a positive int, got {capacity_blocks!r}")
        if type(page_size) is not int or page_size < 1:
            raise RadixCacheError(f"page_size must be a positive int, got {page_size!r}")
        self.capacity_blocks = capacity_blocks
        self.page_size = page_size
        self.policy = make_policy(policy)
        self._pool = BlockPool(capacity_blocks)
        self._uids = new_node_ids()
        self._clock = 0  # logical time: one tick per match or insert, so runs are deterministic
        self._roots: dict[Hashable, TreeNode] = {}
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
        self._stats = StatsCounter()
        # Called as on_evict(leaf, keep, blocks) just before `blocks` (the leaf's pages from index `keep` on) leave
        # the tree, while the leaf still holds them and its full key: a lower tier copies them out here. It must
        # not change the tree, and it must not raise.
        self.on_evict: Callable[[TreeNode, int, array], None] | None = None

    # ------------------------------------------------------------------ public API: queries

    def match_prefix(self, tokens: Sequence[int], *, namespace: Hashable = None) -> MatchResult:
        """Longest cached prefix of `tokens` in `namespace`, rounded down to whole pages.

        Modifies the tree: refreshes access times and hit counts along the matched path (what the policies
        sort by), and splits a node when the match ends inside it, so that the result ends at a node boundary.
        """
        if type(tokens) is array and tokens.typecode == TOKEN_TYPECODE:
            # Read during the call only (nodes keep slices). The signs are checked below, past the tokens the walk
            # finds in the tree: those are non-negative, as every token the tree holds was checked on the way in.
            arr, signs_checked = tokens, False
        else:
            arr, signs_checked = as_token_array(tokens), True
        try:
            root = self._roots[namespace]
        except BaseException as exc:  # an unseen or unhashable namespace: _root validates, or makes a transient root
            if not signs_checked:
                self._raise_bad_token(arr)  # a bad token is reported first, as it always was
                signs_checked = True
            if not isinstance(exc, (KeyError, TypeError)):  # the namespace's own __hash__ or __eq__ raised
                raise
            root = self._root(namespace, create=False)  # before anything changes
        buf = arr.tobytes()  # one copy: node keys are compared against it in place, and the signs read from it
        # The walk reads only, so a bad token below it still changes nothing.
        node, length, blocks, partial, k = self._descend(root, arr, buf)
        if not signs_checked:
            check_signs(arr, length + k, buf)
        if partial is not None:
            node = self._split(partial, k)
            blocks.extend(node.blocks)
            length += k
        self._clock += 1
        stats = self._stats
        stats.queries += 1
        stats.query_tokens += len(arr)
        entry = node.evict_key
        clock = self._clock
        up = node
        while up.parent is not None:  # the inlined _touch(node, hit=True)
            up.last_access = clock
            up.hit_count += 1
            up = up.parent
        if length and self.policy.observes_hits:  # before the re-key, so the new key sees what was learned
            self.policy.on_hit(node)
        if entry is not None:  # an evictable leaf, re-keyed: its old entry goes stale
            self._stale += 1
            self._set_add(node)
        stats.hit_tokens += length
        return _new_match(MatchResult, (length, blocks, node))  # MatchResult(length, blocks, node), one call less

    def peek(self, tokens: Sequence[int], *, namespace: Hashable = None) -> MatchResult:
        """`match_prefix`'s length and blocks, without changing anything.

        No split, no stats, no clock tick, no access time or hit count, no namespace root, and the evictable
        set is untouched. `node` is the deepest node the match reaches: when the match ends inside a node, that
        partially matched node (whose pages past `length` are not in `blocks`); when nothing matches, the
        namespace root (a transient, unregistered one for an unseen namespace).

        The node is for identity only (grouping requests by the subtree they would share), never to lock: a
        partially matched node covers more than was matched, so locking it would pin tokens past `length`.
        To lock a prefix, use `match_prefix` then `lock`, or `lock_prefix`.
        Raises InvalidTokensError for bad tokens and RadixCacheError for an unhashable namespace.
        """
        arr = token_view(tokens)  # read during the call only
        try:
            root = self._roots[namespace]
        except (KeyError, TypeError):  # an unseen or unhashable namespace: _root validates, or makes a transient root
            root = self._root(namespace, create=False)
        node, length, blocks, partial, partial_len = self._descend(root, arr)  # read-only; blocks is a fresh array
        if partial is not None:  # ends inside `partial`: report it, with only its matched pages
            blocks.extend(partial.blocks[: partial_len // self.page_size])
            length += partial_len
            node = partial
        return MatchResult(length, blocks, node)

    # ------------------------------------------------------------------ public API: blocks

    def allocate(self, n: int) -> array:
        """n free block ids (an int64 array), now held by the caller, evicting unlocked leaves as needed.

        Raises CacheFullError, with nothing changed, when n exceeds free plus evictable blocks.
        """
        if type(n) is not int or n < 0:
            n = self._count_arg(n, "allocate")
        if n > self.capacity_blocks:
            raise CacheFullError(f"allocate: {n} blocks requested, but the capacity is {self.capacity_blocks}")
        short = n - self._pool.free_count
        if short > 0:
            if short > self._evictable:
                raise CacheFullError(
                    f"allocate: {n} blocks requested, but only {self._pool.free_count} are free and "
                    f"{self._evictable} evictable ({self.locked_blocks} locked)"
                )
            self._evict(short)
        return self._pool.take(n)

    def free(self, blocks: Sequence[int]) -> None:
        """Give back blocks from `allocate` that were never inserted."""
        ids = self._pool.normalize(blocks, "free")
        self._pool.check_held(ids, "free")
        self._pool.release_held(ids)

    def insert(self, tokens: Sequence[int], blocks: Sequence[int], *, namespace: Hashable = None) -> int:
        """Add `tokens` with their KV `blocks` (one per page, the last page possibly partial) to the tree.

        The tree takes the blocks of the new full pages. For pages that were already cached, a block that is
        the tree's own block at that position is left as it is, and any other (held) block is a duplicate and
        goes back to the free pool. The block of an unaligned tail page stays with the caller.
        `blocks` may be any sequence of ints; a block-id array (what `match_prefix` and `allocate` return, e.g.
        `match.blocks + new`) is proven valid without a Python loop over it.
        Returns the number of tokens that were already cached.
        """
        if type(tokens) is array and tokens.typecode == TOKEN_TYPECODE:
            # Read during the call only (nodes keep slices). The signs are checked by the fast path past the
            # tokens its walk finds in the tree (those are non-negative), or in full by the exact path.
            arr, signs_checked = tokens, False
        else:
            arr, signs_checked = as_token_array(tokens), True
        p = self.page_size
        pool = self._pool
        full_pages = len(arr) // p
        try:
            ids = as_block_ids(blocks)  # None: not all ints; the exact path below says which is wrong
            fast = None if ids is None else self._insert_fast_path(arr, ids, namespace, signs_checked)
        except BaseException as exc:  # raised by the caller's objects (a block's __index__, a namespace's __hash__)
            if not signs_checked and not isinstance(exc, InvalidTokensError):
                self._raise_bad_token(arr)  # a bad token is reported first, as it always was
            raise
        if fast is not None:  # proven valid by the leases, without a Python loop over the blocks
            node, matched_pages, partial, partial_len, start, cover = fast
            self._clock += 1
            taken = pool.adopt_cover(cover, full_pages - start) if full_pages > start else block_ids()
            if matched_pages > start:  # held duplicates of cached pages (start == 0): straight back to free
                pool.release_tree(taken[: matched_pages - start])
                taken = taken[matched_pages - start :]
            new_blocks = taken
        else:  # the exact path: every block checked one by one, with a precise error
            if not signs_checked:
                check_signs(arr)
            ids = pool.normalize(blocks, "insert")
            pages = -(-len(arr) // p)
            if len(ids) != pages:
                raise BlockCountError(f"insert: {len(arr)} tokens at page_size {p} need {pages} blocks, got {len(ids)}")
            roots_before = len(self._roots)
            root = self._root(namespace)
            node, _, cached, partial, partial_len = self._descend(root, arr[: full_pages * p])
            if partial is not None:
                cached = cached + partial.blocks[: partial_len // p]
            matched_pages = len(cached)
            try:
                self._check_insert_blocks(ids, cached)
            except BlockStateError:
                if len(self._roots) > roots_before:  # the namespace was created just now: errors change nothing
                    del self._roots[namespace]
                raise

            self._clock += 1
            duplicates = block_ids(b for b, mine in zip(ids, cached, strict=False) if b != mine)
            if duplicates:
                pool.release_held(duplicates)
            new_blocks = ids[matched_pages:full_pages]
            if new_blocks:
                pool.adopt(new_blocks)
        if full_pages > matched_pages:
            if partial is not None:
                node = self._split(partial, partial_len)
            if node.evict_key is not None:  # about to gain a child: no longer a leaf (the inlined _set_discard)
                node.evict_key = None
                self._stale += 1
            clock = self._clock
            n = node
            while n.parent is not None:  # the inlined _touch(node, hit=False): node is out of the set now
                n.last_access = clock
                n = n.parent
            key = arr[matched_pages * p : full_pages * p]
            leaf = TreeNode(next(self._uids), key, new_blocks, node, node.namespace, clock)
            node.children[key[0] if p == 1 else key[:p].tobytes()] = leaf
            self._evictable += len(new_blocks)
            self._set_add(leaf)
            self._stats.inserted_tokens += len(key)
        else:
            self._touch(partial if partial is not None else node, hit=False)
        return matched_pages * p

    def evict(self, n: int) -> int:
        """Free up to n blocks now from unlocked leaves, in policy order. Returns how many were freed."""
        return self._evict(self._count_arg(n, "evict"))

    # ------------------------------------------------------------------ public API: locking

    def lock(self, node: TreeNode) -> None:
        """Protect `node` and every ancestor from eviction (a reference count on the whole path)."""
        if node.parent is None and self._is_root(node):  # (raises for an evicted node)
            return
        node.own_locks += 1
        n, moved = node, 0
        while n.parent is not None:
            if n.lock_ref == 0:
                moved += len(n.blocks)
                if n.evict_key is not None:  # out of the evictable set: its entry goes stale (the inlined _set_discard)
                    n.evict_key = None
                    self._stale += 1
            n.lock_ref += 1
            n = n.parent
        self._evictable -= moved  # blocks of nodes that just became locked
        self._tree_locked += moved

    def lock_prefix(self, tokens: Sequence[int], num_tokens: int, *, namespace: Hashable = None) -> TreeNode | None:
        """Lock exactly the first `num_tokens` of `tokens` (a pin); return the node to pass to `unlock`.

        `num_tokens` must be an int, a positive multiple of page_size, and at most `len(tokens)`; else
        RadixCacheError. When the tree holds all of those tokens, the node holding position `num_tokens` is
        split so that a node ends exactly there (unless one already does), and that node is locked: its tail,
        if any, stays evictable. When fewer tokens are cached (or the namespace is unseen), returns None and
        changes nothing: no split, no root.
        Not a query: no stats, no clock tick, no access time or hit count. Raises InvalidTokensError for bad
        tokens and RadixCacheError for an unhashable namespace, with nothing changed.
        """
        arr = token_view(tokens)  # read during the call only
        n = self._pin_length(num_tokens, len(arr))
        root = self._root(namespace, create=False)  # an unseen namespace: a transient root with no children
        node, length, _, partial, partial_len = self._descend(root, arr[:n])  # stops at n: n is page-aligned
        if partial is not None:
            if length + partial_len < n:  # the match ends inside `partial`, short of n
                return None
            node = self._split(partial, partial_len)  # a node now ends at n; the tail keeps its priority
        elif length < n:
            return None
        # Invariant: node.end_len == n, and node is not a root (n > 0), so the lock is real.
        self.lock(node)
        return node

    def unlock(self, node: TreeNode) -> None:
        """Undo one `lock(node)`. Raises LockError, with nothing changed, if the node is not locked."""
        if node.parent is None and self._is_root(node):  # (raises for an evicted node)
            return
        # lock_ref also counts locks taken on descendants: only the node's own locks may be undone here.
        # Ancestors count at least as many locks, so checking the node suffices.
        if node.own_locks <= 0:
            raise LockError(f"unlock: {node!r} is not locked")
        node.own_locks -= 1
        n, moved = node, 0
        while n.parent is not None:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                moved += len(n.blocks)
                if not n.children:
                    self._set_add(n)
            n = n.parent
        self._evictable += moved  # blocks of nodes that just became unlocked
        self._tree_locked -= moved

    # ------------------------------------------------------------------ public API: the clock

    @property
    def clock(self) -> int:
        """The cache's logical time: it ticks once per match or insert, and stamps `last_access` and `created`."""
        return self._clock

    def advance_clock(self, to: int) -> None:
        """Move the clock forward to `to` (no change if it is already there or past it).

        For a replay that ties the clock to real time, e.g. a trace's timestamps in microseconds: the clock stays
        an int that grows by at least one per match or insert, so every policy's order is the same as with ticks
        alone, while the intervals a policy measures between accesses (`reuse`) become intervals of time.
        Raises RadixCacheError, with nothing changed, unless `to` is a non-negative int.
        """
        if type(to) is not int or to < 0:
            raise RadixCacheError(f"advance_clock: the time must be a non-negative int, got {to!r}")
        if to > self._clock:
            self._clock = to

    # ------------------------------------------------------------------ public API: sizes and checks

    @property
    def free_blocks(self) -> int:
        return self._pool.free_count

    @property
    def evictable_blocks(self) -> int:
        """Blocks in unlocked tree nodes: reclaimable by eviction."""
        return self._evictable

    @property
    def locked_blocks(self) -> int:
        """Blocks in locked tree nodes plus blocks held by callers (allocated, not yet inserted or freed)."""
        return self._tree_locked + self._pool.held

    @property
    def held_blocks(self) -> int:
        """Blocks allocated to callers and not yet inserted or freed (a part of locked_blocks)."""
        return self._pool.held

    @property
    def cached_tokens(self) -> int:
        """Tokens stored in the tree, over all namespaces."""
        return (self._evictable + self._tree_locked) * self.page_size

    @property
    def stats(self) -> CacheStats:
        return self._stats.snapshot()

    def reset_stats(self) -> None:
        self._stats = StatsCounter()

    def namespaces(self) -> list[Hashable]:
        """Namespaces that hold cached tokens now (a namespace's root goes when its last node is evicted)."""
        return list(self._roots)

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every non-root node, depth first, over all namespaces."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_invariants(self) -> None:
        """Raise AssertionError, naming the violation, unless every structural invariant holds."""
        from radixcache.invariants import check_invariants

        check_invariants(self)

    def __repr__(self) -> str:
        return (
            f"RadixCache(capacity_blocks={self.capacity_blocks}, page_size={self.page_size}, "
            f"policy={self.policy.name!r}, free={self.free_blocks}, evictable={self.evictable_blocks}, "
            f"locked={self.locked_blocks})"
        )

    # ------------------------------------------------------------------ private: the walk

    def _root(self, namespace: Hashable, *, create: bool = True) -> TreeNode:
        """The namespace's root. Without `create`, an unseen namespace gets a transient empty root that is not
        registered, so lookups under ever-new namespaces (per-user salts) leave nothing behind."""
        try:
            root = self._roots.get(namespace)
        except TypeError:  # dict lookup hashes the namespace first
            raise RadixCacheError(f"namespace must be hashable, got {type(namespace).__name__}") from None
        if root is None:
            root = TreeNode(0, empty_key(), block_ids(), None, namespace, self._clock)  # uid 0 marks a root
            if create:
                self._roots[namespace] = root
        return root

    def _child_key(self, tokens: array, pos: int) -> object:
        p = self.page_size
        return tokens[pos] if p == 1 else tokens[pos : pos + p].tobytes()

    def _descend(self, root: TreeNode, arr: array, buf: bytes | None = None) -> _Descent:
        """Walk down from `root` along `arr` without changing anything. `buf`: `arr.tobytes()`, if the caller has it."""
        p = self.page_size
        n = len(arr)
        if buf is None:
            buf = arr.tobytes()  # node keys are compared against it in place
        node, pos, blocks = root, 0, block_ids()
        while n - pos >= p:
            child = node.children.get(arr[pos] if p == 1 else buf[pos * 8 : (pos + p) * 8])
            if child is None:
                break
            key = child.key
            k = len(key)
            if not buf.startswith(key, pos * 8):  # the common case, a whole node, takes one compare
                k = common_prefix_length(key, arr, pos)
                if p > 1:
                    k -= k % p
                if k < len(key):
                    return node, pos, blocks, child, k
            blocks.extend(child.blocks)
            pos += k
            node = child
        return node, pos, blocks, None, 0

    def _split(self, child: TreeNode, k: int) -> TreeNode:
        """Split `child` after its first k tokens; return the new parent holding them.

        The original object keeps the tail, so a handle to it still ends at the same position.
        """
        p = self.page_size
        parent = child.parent
        assert parent is not None and 0 < k < len(child.key) and k % p == 0
        head = TreeNode(next(self._uids), child.key[:k], child.blocks[: k // p], parent, child.namespace, 0)
        head.lock_ref = child.lock_ref
        head.last_access = child.last_access
        head.created = child.created
        head.hit_count = child.hit_count
        parent.children[self._child_key(child.key, 0)] = head
        child.key = child.key[k:]
        child.blocks = child.blocks[k // p :]
        child.parent = head
        child.prefix_len += k
        head.children[self._child_key(child.key, 0)] = child
        # A split is not an access: an evictable child keeps its priority, unless the policy ranks a leaf
        # by the blocks it holds.
        if child.evict_key is not None and self.policy.ranks_by_extent:
            self._set_discard(child)
            self._set_add(child)
        return head

    def _touch(self, node: TreeNode, *, hit: bool) -> None:
        """Refresh access time (and hit count) from `node` up to its root, re-sorting `node` if evictable."""
        entry = node.evict_key
        clock = self._clock
        n = node
        while n.parent is not None:
            n.last_access = clock
            if hit:
                n.hit_count += 1
            n = n.parent
        if entry is not None:  # re-keyed: the old entry goes stale (the inlined _set_discard)
            self._stale += 1
            self._set_add(node)

    # ------------------------------------------------------------------ private: eviction

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

    # ------------------------------------------------------------------ private: validation

    def _is_root(self, node: TreeNode) -> bool:
        if node.parent is not None:
            return False
        if node.uid == 0:  # a root (maybe transient or dropped): holds no blocks, so locking it is a no-op
            return True
        raise LockError(f"{node!r} has been evicted (or belongs to another cache); match again")

    def _insert_fast_path(
        self, arr: array, blocks: array, namespace: Hashable, signs_checked: bool
    ) -> tuple[TreeNode, int, TreeNode | None, int, int, list] | None:
        """The walk of an insert whose blocks are proven valid at C speed, or None: take the exact path.

        Proof: `blocks` is a block-id array (so every id is an int), as long as the tokens need, and each page
        is either the tree's own block (every matched node's blocks compare equal, by memcmp), or held: a run
        of leases from `allocate` (BlockPool.lease_cover). Held ids are
        distinct and never in the tree, so nothing here can be a duplicate, out of range, or owned elsewhere.
        The walk is `_descend`'s, comparing blocks instead of collecting them; it changes nothing, and neither
        does a failed proof. Unless `signs_checked`, it raises InvalidTokensError for a negative token: only the
        tokens past those the walk found in the tree need the check (the tree holds no negative token).
        Returns (node, matched_pages, partial, partial_len, start, cover): blocks[start:] is covered by
        leases; start is 0 when the cached pages come as held duplicates, else matched_pages.
        """
        p = self.page_size
        if len(blocks) != -(-len(arr) // p):
            return None
        try:
            root = self._roots.get(namespace)  # a new namespace takes the exact path, which creates it
        except TypeError:  # an unhashable namespace
            return None
        if root is None:
            return None
        n = len(arr) // p * p  # full pages only: the unaligned tail is never matched
        buf = arr.tobytes()  # node keys are compared against it in place, and the signs read from it
        node, pos, pages, own = root, 0, 0, True
        partial, partial_len = None, 0
        while n - pos >= p:
            child = node.children.get(arr[pos] if p == 1 else buf[pos * 8 : (pos + p) * 8])
            if child is None:
                break
            key = child.key
            k = len(key)
            if pos + k > n or not buf.startswith(key, pos * 8):  # not a whole node: find how far it matches
                k = common_prefix_length(key, arr, pos)
                if p > 1:
                    k -= k % p
            if k < len(key):
                partial, partial_len = child, k
                if own and blocks[pages : pages + k // p] != child.blocks[: k // p]:
                    own = False
                pages += k // p
                break
            child_blocks = child.blocks
            if own and blocks[pages : pages + len(child_blocks)] != child_blocks:
                own = False
            pages += len(child_blocks)
            pos += k
            node = child
        if not signs_checked:
            check_signs(arr, pos + partial_len, buf)
        start = pages if own else 0
        cover = self._pool.lease_cover(blocks, start, len(blocks))
        if cover is None:
            return None
        return node, pages, partial, partial_len, start, cover

    def _check_insert_blocks(self, ids: array, cached: array) -> None:
        """Each block must be the tree's own block at its position, or held by the caller."""
        pool = self._pool
        for index, block in enumerate(ids):
            if (index < len(cached) and block == cached[index]) or pool.is_held(block):
                continue
            where = "a cached page" if index < len(cached) else "a new page"
            raise BlockStateError(
                f"insert: block {block} for {where} (index {index}) is {STATE_NAMES[pool.state_of(block)]}"
                + (f"; the tree holds that page in block {cached[index]}" if index < len(cached) else "")
            )

    def _pin_length(self, num_tokens: int, available: int) -> int:
        """Validate lock_prefix's `num_tokens`: an int (not a bool), a positive multiple of page_size,
        at most the tokens given."""
        p = self.page_size
        try:
            if type(num_tokens) is bool:  # an int to operator.index, but never a token count
                raise TypeError
            n = operator.index(num_tokens)
        except TypeError:
            raise RadixCacheError(f"lock_prefix: num_tokens must be an int, got {num_tokens!r}") from None
        if n <= 0 or n % p:
            raise RadixCacheError(
                f"lock_prefix: num_tokens must be a positive multiple of page_size {p}, got {num_tokens!r}"
            )
        if n > available:
            raise RadixCacheError(f"lock_prefix: num_tokens {num_tokens!r} exceeds the {available} tokens given")
        return n

    @staticmethod
    def _raise_bad_token(arr: array) -> None:
        """Raise InvalidTokensError if the int64 array `arr` holds a negative token (outside any other error)."""
        bad = negative_token(arr)
        if bad is not None:
            raise InvalidTokensError(bad) from None

    @staticmethod
    def _count_arg(n: int, what: str) -> int:
        try:
            n = operator.index(n)
        except TypeError:
            raise RadixCacheError(f"{what}: block count must be an int, got {n!r}") from None
        if n < 0:
            raise RadixCacheError(f"{what}: block count must be >= 0, got {n}")
        return n
