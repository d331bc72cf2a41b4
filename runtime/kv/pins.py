"""Pins: prefixes a caller asked to keep in the cache (`generate(..., pin=n)`) until it unpins them.

A pin locks exactly the pages asked for (`RadixCache.lock_prefix` splits the node that holds the n-th token), so a
pin of 32 tokens holds two 16-token pages, never the rest of the node around them. Pins together may lock at most
`max_blocks` pages (the engine's `max_pinned_fraction` of the pool): a pin that would pass that share is refused,
and the caller sees it in the result (`pinned_tokens == 0`); the request itself runs as usual.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from radixcache import RadixCache, TreeNode


class PinTable:
    """The pins of one cache: `(namespace, tokens) -> the locked node that ends them`."""

    def __init__(self, cache: RadixCache, max_blocks: int) -> None:
        self.cache = cache
        self.max_blocks = max_blocks
        self._pins: dict[tuple[Hashable, tuple[int, ...]], TreeNode] = {}

    def __len__(self) -> int:
        return len(self._pins)

    @property
    def blocks(self) -> int:
        """Pages locked by pins (a page under two pins counts once). Read on other threads too (Engine.stats): it
        walks a copy of the table, which the loop thread may change meanwhile."""
        seen: set[int] = set()
        total = 0
        for node in list(self._pins.values()):
            n: TreeNode | None = node
            while n is not None and n.parent is not None and n.uid not in seen:
                seen.add(n.uid)
                total += len(n.blocks)
                n = n.parent
        return total

    def pin(self, tokens: Sequence[int], namespace: Hashable) -> int:
        """Pin the first `len(tokens)` tokens (a multiple of the page size, already in the tree). Returns the
        tokens pinned: `len(tokens)`, or 0 when the pin is refused (past the pinned share) or not cached."""
        key = (namespace, tuple(tokens))
        if not tokens:
            return 0
        if key in self._pins:
            return len(tokens)
        node = self.cache.lock_prefix(tokens, len(tokens), namespace=namespace)
        if node is None:
            return 0
        self._pins[key] = node
        try:
            over = self.blocks > self.max_blocks  # measured after locking: pages shared with other pins count once
        except BaseException:  # never keep a lock the table cannot account for
            over = True
            raise
        finally:
            if over:
                del self._pins[key]
                self.cache.unlock(node)
        return 0 if over else len(tokens)

    def unpin(self, tokens: Sequence[int] | None, namespace: Hashable) -> int:
        """Release the pins whose tokens begin `tokens` in `namespace` (every pin when `tokens` is None). Returns
        how many were released."""
        prefix = None if tokens is None else tuple(tokens)
        gone = [k for k in self._pins if prefix is None or (k[0] == namespace and prefix[: len(k[1])] == k[1])]
        for k in gone:
            self.cache.unlock(self._pins.pop(k))
        return len(gone)
