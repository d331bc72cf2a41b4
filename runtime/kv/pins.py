"""Pins: prefixes a caller asked to keep in the cache (`generate(..., pin=n)`) until it unpins them.

A pin locks exactly the pages asked for (`RadixCache.lock_prefix` splits the node that holds the n-th token), so a
pin of 32 tokens holds two 16-token pages, never the rest of the node around them. Pins together may lock at most
`max_blocks` pages (the engine's `max_pinned_fraction` of the pool): a pin that would pass that share is refused,
and the caller sees it in the result (`pinned_tokens == 0`); the request itself runs as usual.

Each pin records the prompts it was made for (a fork's branches: the fork's prefix), and `unpin(prompt)` releases
only the pins made for that prompt: the pages of a shared system prompt pinned for itself stay pinned when a longer
prompt that begins with it, pinned by another caller, is unpinned. A lock is held while any prompt's pin needs it.

Each prompt's pin is held by its holders (a string each, None for the caller at large; every Session is one):
pinning a prompt again for the same holder changes nothing (a client that pins its system prompt at every request
and unpins it once keeps no page), while two holders of one prompt each hold a share, and `unpin(..., holder=h)`
releases h's shares only. `unpin` naming no holder releases every holder's.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from radixcache import RadixCache, TreeNode


class PinTable:
    """The pins of one cache: `(namespace, tokens) -> the locked node that ends them`, and for each the prompts it
    was made for (never empty while it is held)."""

    def __init__(self, cache: RadixCache, max_blocks: int) -> None:
        self.cache = cache
        self.max_blocks = max_blocks
        self._pins: dict[tuple[Hashable, tuple[int, ...]], TreeNode] = {}
        # key -> {prompt it was made for: its holders}
        self._made_for: dict[tuple[Hashable, tuple[int, ...]], dict[tuple[int, ...], set[str | None]]] = {}

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

    def pin(
        self,
        tokens: Sequence[int],
        namespace: Hashable,
        made_for: Sequence[int] | None = None,
        holder: str | None = None,
    ) -> int:
        """Pin the first `len(tokens)` tokens (a multiple of the page size, already in the tree) for the prompt
        `made_for` (None: `tokens`), which `unpin` names, held by `holder` (None: the caller at large). Returns the
        tokens pinned: `len(tokens)`, or 0 when the pin is refused (past the pinned share) or not cached."""
        key = (namespace, tuple(tokens))
        if not tokens:
            return 0
        prompt = key[1] if made_for is None else tuple(made_for)
        if key in self._pins:
            self._made_for[key].setdefault(prompt, set()).add(holder)
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
        if not over:
            self._made_for[key] = {prompt: {holder}}
        return 0 if over else len(tokens)

    def unpin(
        self,
        prompt: Sequence[int] | None,
        namespace: Hashable,
        every_namespace: bool = False,
        *,
        holder: str | None = None,
    ) -> int:
        """Release the pins made for `prompt` in `namespace` (every pin there when `prompt` is None; in every
        namespace too with `every_namespace`): `holder`'s shares only when it is given, else every holder's; a page
        another prompt's (or holder's) pin holds stays locked. Returns how many pins (one per prompt and pinned
        prefix, released for good or, with `holder`, its share of them) were released."""
        made_for = None if prompt is None else tuple(prompt)
        released = 0
        for key in [k for k in self._pins if (every_namespace and made_for is None) or k[0] == namespace]:
            owners = self._made_for[key]
            for p in [p for p in owners if made_for is None or p == made_for]:
                if holder is None:
                    released += 1
                    del owners[p]
                elif holder in owners[p]:
                    released += 1
                    owners[p].discard(holder)
                    if not owners[p]:
                        del owners[p]
            if not owners:
                del self._made_for[key]
                self.cache.unlock(self._pins.pop(key))
        return released
