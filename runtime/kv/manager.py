"""Moves a request's KV blocks through the radix cache: match, lock, allocate, grow, insert, unlock, free.

Every method leaves the cache's invariants true, also when it raises: a request either holds its lock and
blocks (RUNNING) or holds nothing (WAITING, FINISHED, ABORTED). Preemption gives a running request's computed
KV to the tree (evictable, so that its resumption hits it if it survives) and puts it back to WAITING.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from enum import Enum
from typing import TYPE_CHECKING

from radixcache import RadixCache, TreeNode
from radixcache.tokens import as_token_array, common_prefix_length

if TYPE_CHECKING:
    from radixcache.runtime.engine.request import Request


class Status(Enum):
    WAITING = "waiting"  # not yet admitted (or preempted): holds no blocks
    RUNNING = "running"  # admitted: holds a lock and blocks
    FINISHED = "finished"  # released: its KV went to the tree (or was freed)
    ABORTED = "aborted"  # released after an error


class KVManager:
    """The engine's only door to the RadixCache. With `enable_cache=False` it allocates and frees blocks the
    same way but never matches or inserts, so nothing is reused (the baseline)."""

    def __init__(self, cache: RadixCache, *, enable_cache: bool = True) -> None:
        self.cache = cache
        self.enable_cache = enable_cache
        self.page_size = cache.page_size
        self._roots: dict[Hashable, TreeNode] = {}  # namespace roots seen, for read-only peeks

    def pages(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    # ------------------------------------------------------------------ admission

    def admit(self, req: Request, *, reserve: int = 0, strict: bool = True) -> bool:
        """Match what the request needs (a fresh prompt less its last token; a resumed request's tokens but the
        last), lock the match, and allocate pages up to `req.prefill_end`, evicting if needed.

        `reserve`: pages that must stay free or evictable afterwards (headroom for running decodes). When the
        pages are not there: with `strict`, raise CacheFullError; otherwise return False. Either way nothing
        is held then.
        """
        if req.status is not Status.WAITING:
            raise RuntimeError(f"request {req.rid} is {req.status.value}, not waiting")
        cache = self.cache
        end = req.prefill_end
        resumed = bool(req.output_ids)
        blocks: list[int] = []
        node = None
        if self.enable_cache:
            match = cache.match_prefix(req.all_ids[: end if resumed else end - 1], namespace=req.namespace)
            node, blocks = match.node, match.blocks
            cache.lock(node)
            self._remember_root(node)
        try:
            need = self.pages(end) - len(blocks)
            if not strict and need + reserve > cache.free_blocks + cache.evictable_blocks:
                if node is not None:
                    cache.unlock(node)
                return False
            new = cache.allocate(need)
        except BaseException:
            if node is not None:
                cache.unlock(node)
            raise
        matched = len(blocks) * self.page_size
        req.match_node = node
        req.tree_blocks = len(blocks)
        req.block_table = blocks + new
        req.num_kv = matched
        if req.preemptions == 0 and not resumed and req.t_admitted is None:
            req.cached_tokens = matched
        else:  # a resumption: what it computes again is recomputation, not a miss, and its hits are not hits
            req.recomputed_tokens += max(0, req.computed_max - matched)
        req.status = Status.RUNNING
        return True

    def reserve(self, req: Request, num_tokens: int) -> None:
        """Make the block table cover `num_tokens` positions, allocating new pages (evicting if needed)."""
        missing = self.pages(num_tokens) - len(req.block_table)
        if missing > 0:
            req.block_table.extend(self.cache.allocate(missing))

    def pages_short(self, req: Request, num_tokens: int) -> int:
        return max(0, self.pages(num_tokens) - len(req.block_table))

    # ------------------------------------------------------------------ sharing while running

    def commit_prefix(self, req: Request) -> None:
        """Give the tree the request's computed full pages now (not at release), so that other requests hit them
        while this one still runs: the request re-locks the node that ends its pages and reads the tree's blocks
        (a page another request inserted first replaces our duplicate, which the tree freed)."""
        if not self.enable_cache or req.status is not Status.RUNNING:
            return
        p = self.page_size
        full = req.num_kv // p
        if full <= req.tree_blocks:
            return
        tokens = req.all_ids[: full * p]
        self.cache.insert(tokens, req.block_table[:full], namespace=req.namespace)
        old = req.match_node
        if old is not None and old.parent is not None:  # walk down from our locked node: the tree is unchanged
            node, blocks = walk(old, as_token_array(tokens), req.tree_blocks * p, p)
        else:  # no hit before: the namespace's root is the cache's to give (a lookup, counted in cache.stats)
            match = self.cache.match_prefix(tokens, namespace=req.namespace)
            node, blocks = match.node, match.blocks
        assert len(blocks) == full - req.tree_blocks, "the pages just inserted are in the tree"
        self.cache.lock(node)
        self._remember_root(node)
        req.match_node = node
        if old is not None:
            self.cache.unlock(old)
        req.block_table[req.tree_blocks : full] = blocks
        req.tree_blocks = full

    def lock_prefix(self, req: Request, num_tokens: int) -> TreeNode | None:
        """Lock (for pinning) the tree node that ends the request's first `num_tokens` tokens, page-aligned.
        The caller owns the extra lock. None when nothing is in the tree there."""
        if not self.enable_cache or req.match_node is None:
            return None
        p = self.page_size
        n = min(num_tokens, req.tree_blocks * p) // p * p
        if n == 0:
            return None
        root = self._root_of(req.match_node)
        node, blocks = walk(root, as_token_array(req.all_ids[:n]), 0, p)
        if len(blocks) * p < n:
            return None
        self.cache.lock(node)
        return node

    def peek(self, tokens: Sequence[int], namespace: Hashable) -> tuple[int, TreeNode | None]:
        """Cached tokens of `tokens` (whole pages) and the deepest node reached, without touching the tree."""
        if not self.enable_cache:
            return 0, None
        root = self._roots.get(namespace)
        if root is None or not root.children:  # unknown, or emptied (its root may have been dropped): ask
            root = self.cache.match_prefix([], namespace=namespace).node  # an empty lookup: no tokens counted
            if not root.children:
                self._roots.pop(namespace, None)
                return 0, None
            self._roots[namespace] = root
        node, blocks = walk(root, as_token_array(tokens), 0, self.page_size)
        return len(blocks) * self.page_size, node

    # ------------------------------------------------------------------ leaving

    def release(self, req: Request) -> None:
        """A finished request: give its computed KV to the tree (positions `< num_kv`), unlock its match and
        free what the tree did not take (the unaligned tail page and any unused page)."""
        if req.status is not Status.RUNNING:
            raise RuntimeError(f"request {req.rid} is {req.status.value}, not running")
        self._give_back(req)
        req.status = Status.FINISHED

    def preempt(self, req: Request) -> None:
        """Take a running request's blocks back: its computed KV goes to the tree (evictable), everything else
        is freed, and it waits again to be resumed."""
        if req.status is not Status.RUNNING:
            raise RuntimeError(f"request {req.rid} is {req.status.value}, not running")
        req.computed_max = max(req.computed_max, req.num_kv)
        self._give_back(req)
        req.num_kv = 0
        req.preemptions += 1
        req.status = Status.WAITING

    def abort(self, req: Request, *, status: Status = Status.ABORTED) -> None:
        """Free every block the request holds and drop its lock. Safe to call in any state."""
        if req.status is Status.RUNNING:
            held = req.held_blocks
            del req.block_table[req.tree_blocks :]
            if held:
                self.cache.free(held)
            req.block_table = []
            req.tree_blocks = 0
            self._unlock(req)
        req.status = status

    # ------------------------------------------------------------------ private

    def _give_back(self, req: Request) -> None:
        if not self.enable_cache:
            self.abort(req, status=Status.RUNNING)
            return
        cache = self.cache
        used = self.pages(req.num_kv)
        spare = req.block_table[used:]
        if spare:
            cache.free(spare)
            del req.block_table[used:]
        if req.num_kv:
            cache.insert(req.all_ids[: req.num_kv], req.block_table, namespace=req.namespace)
        # The tree now owns every full page (duplicates of cached pages went back to the free pool); only an
        # unaligned tail page is still ours.
        tail = req.block_table[-1:] if req.num_kv % self.page_size else []
        req.block_table = []
        req.tree_blocks = 0
        if tail:
            cache.free(tail)
        self._unlock(req)

    def _unlock(self, req: Request) -> None:
        node, req.match_node = req.match_node, None
        if node is not None:
            self.cache.unlock(node)

    def _remember_root(self, node: TreeNode) -> None:
        """The root above a node in the tree is the namespace's registered root (roots come and go)."""
        if node.parent is not None:
            root = self._root_of(node)
            self._roots[root.namespace] = root

    @staticmethod
    def _root_of(node: TreeNode) -> TreeNode:
        while node.parent is not None:
            node = node.parent
        return node


def walk(node: TreeNode, tokens: object, pos: int, page_size: int) -> tuple[TreeNode, list[int]]:
    """Follow `tokens[pos:]` down from `node` (read-only), whole pages only. Returns the deepest node reached
    (one matched only in part included) and the blocks of the pages matched below `node`."""
    arr = tokens
    n = len(arr)  # type: ignore[arg-type]
    p = page_size
    blocks: list[int] = []
    while n - pos >= p:
        page = arr[pos : pos + p]  # type: ignore[index]
        child = next((c for c in node.children.values() if c.key[:p] == page), None)
        if child is None:
            break
        k = common_prefix_length(child.key, arr, pos)  # type: ignore[arg-type]
        k -= k % p
        blocks.extend(child.blocks[: k // p])
        node = child
        pos += k
        if k < len(child.key):
            break
    return node, blocks
