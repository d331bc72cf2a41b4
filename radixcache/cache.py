"""RadixCache: a radix tree over token ids whose nodes own KV block ids, with pluggable eviction.

The tree holds integers only. Whoever owns the KV memory (the runtime, or the simulator) indexes it by the
block ids handed out here. The cache is not thread-safe: one scheduler thread drives it.

The class is built in layers, each a base class in its own module, all on one object (so a hot path crosses
no extra call or attribute lookup): radixcache.eviction (the evictable set and the eviction walk), under
radixcache.walk (the walk down the tree, splits, the insert's block proof), under radixcache.locking (lock
counts on paths). This module adds the public queries (`match_prefix`, `peek`), the block calls (`allocate`,
`free`, `insert`), the clock, sizes and stats. The blocks themselves are radixcache.blocks' BlockPool.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import NamedTuple

from radixcache.blocks import BlockPool, as_block_ids, block_ids
from radixcache.errors import BlockCountError, BlockStateError, CacheFullError, InvalidTokensError, RadixCacheError
from radixcache.locking import Locking
from radixcache.node import TreeNode, new_node_ids
from radixcache.policy.base import EvictionPolicy, claim
from radixcache.policy.registry import make_policy
from radixcache.stats import CacheStats, StatsCounter
from radixcache.tokens import TOKEN_TYPECODE, as_token_array, check_signs, negative_token, token_view


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


_new_match = tuple.__new__


class RadixCache(Locking):
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
        claim(self.policy)  # each cache owns its policy: one that served another carries that cache's state
        self._pool = BlockPool(capacity_blocks)
        self._uids = new_node_ids()
        self._clock = 0  # logical time: one tick per match or insert, so runs are deterministic
        self._roots: dict[Hashable, TreeNode] = {}
        self._init_evictable_set()  # the evictable heap and the evictable/locked counters (radixcache.eviction)
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
        hint = self.policy.hint_us
        up = node
        while up.parent is not None:  # the inlined _touch(node, hit=True)
            up.last_access = clock
            up.hit_count += 1
            up.hint = hint
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
            # No whole page, nothing to add: a new namespace's root would stay empty, and be listed, for good.
            root = self._root(namespace, create=full_pages > 0)
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
            hint = self.policy.hint_us
            n = node
            while n.parent is not None:  # the inlined _touch(node, hit=False): node is out of the set now
                n.last_access = clock
                n.hint = hint
                n = n.parent
            key = arr[matched_pages * p : full_pages * p]
            leaf = TreeNode(next(self._uids), key, new_blocks, node, node.namespace, clock)
            leaf.hint = hint
            node.children[key[0] if p == 1 else key[:p].tobytes()] = leaf
            self._evictable += len(new_blocks)
            self._set_add(leaf)
            self._stats.inserted_tokens += len(key)
        else:
            if partial is not None:  # ends inside a node: split there, as a match does, so that only the pages
                node = self._split(partial, partial_len)  # inserted are refreshed, not the node's tail past them
            self._touch(node, hit=False)
        return matched_pages * p

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

    # ------------------------------------------------------------------ private: validation

    @staticmethod
    def _raise_bad_token(arr: array) -> None:
        """Raise InvalidTokensError if the int64 array `arr` holds a negative token (outside any other error)."""
        bad = negative_token(arr)
        if bad is not None:
            raise InvalidTokensError(bad) from None
