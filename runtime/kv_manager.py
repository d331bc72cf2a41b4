"""Moves a request's KV blocks through the radix cache: match, lock, allocate, grow, insert, unlock, free.

Every method leaves the cache's invariants true, also when it raises: a request either holds its lock and
blocks (RUNNING) or holds nothing (WAITING, FINISHED, ABORTED).
"""

from __future__ import annotations

from radixcache import RadixCache
from runtime.request import Request, Status


class KVManager:
    """The engine's only door to the RadixCache. With `enable_cache=False` it allocates and frees blocks the
    same way but never matches or inserts, so nothing is reused (the baseline)."""

    def __init__(self, cache: RadixCache, *, enable_cache: bool = True) -> None:
        self.cache = cache
        self.enable_cache = enable_cache
        self.page_size = cache.page_size

    def pages(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def admit(self, req: Request) -> None:
        """Match the prompt (keeping at least its last token to compute), lock the match, and allocate pages
        for the rest of the prompt, evicting if needed. Raises CacheFullError with nothing held."""
        if req.status is not Status.WAITING:
            raise RuntimeError(f"request {req.rid} is {req.status.value}, not waiting")
        cache = self.cache
        prompt = req.prompt_ids
        blocks: list[int] = []
        node = None
        if self.enable_cache:
            match = cache.match_prefix(prompt[:-1], namespace=req.namespace)
            node, blocks = match.node, match.blocks
            cache.lock(node)
        try:
            new = cache.allocate(self.pages(len(prompt)) - len(blocks))
        except BaseException:
            if node is not None:
                cache.unlock(node)
            raise
        req.match_node = node
        req.tree_blocks = len(blocks)
        req.block_table = blocks + new
        req.cached_tokens = req.num_kv = len(blocks) * self.page_size
        req.status = Status.RUNNING

    def reserve(self, req: Request, num_tokens: int) -> None:
        """Make the block table cover `num_tokens` positions, allocating new pages (evicting if needed)."""
        missing = self.pages(num_tokens) - len(req.block_table)
        if missing > 0:
            req.block_table.extend(self.cache.allocate(missing))

    def release(self, req: Request) -> None:
        """A finished request: give its computed KV to the tree (positions `< num_kv`), unlock its match and
        free what the tree did not take (the unaligned tail page and any unused page)."""
        if req.status is not Status.RUNNING:
            raise RuntimeError(f"request {req.rid} is {req.status.value}, not running")
        cache = self.cache
        if not self.enable_cache:
            self.abort(req, status=Status.FINISHED)
            return
        used = self.pages(req.num_kv)
        spare = req.block_table[used:]
        if spare:
            cache.free(spare)
            del req.block_table[used:]
        cache.insert(req.all_ids[: req.num_kv], req.block_table, namespace=req.namespace)
        # The tree now owns every full page (duplicates of cached pages went back to the free pool); only an
        # unaligned tail page is still ours.
        tail = req.block_table[-1:] if req.num_kv % self.page_size else []
        req.block_table = []
        req.tree_blocks = 0
        if tail:
            cache.free(tail)
        self._unlock(req)
        req.status = Status.FINISHED

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

    def _unlock(self, req: Request) -> None:
        node, req.match_node = req.match_node, None
        if node is not None:
            self.cache.unlock(node)
