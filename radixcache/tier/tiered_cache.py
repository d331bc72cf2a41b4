"""The device tree with the tiers under it: where each page of a prompt is, and when a page moves down.

Tiers, top to bottom: the device tree (a RadixCache: what attention reads), a host tier (a PageTier of slots in host
memory), and a lower tier (the disk store in the runtime, a PageTier in the simulator). Below the device, pages are
addressed by chained hash (radixcache.page_hash), so a prompt's match is: the device's longest prefix, then the pages
after it that the host holds consecutively, then the pages after those that the lower tier holds.

Write policies decide when the host gets a copy of a device page:
- write_through: every page the tree adopts is copied to the host at once; device eviction then only drops.
- write_through_selective: a page is copied once its node has been hit twice (SGLang's rule); device eviction drops.
- write_back: a page is copied to the host only when the device evicts it.
The lower tier is written through: every adopted page goes down (asynchronously in the runtime), so that the cache
survives a restart.

Data moves through callbacks, so this module stays pure Python: `copy_to_host(blocks, slots)` copies device pages
into host slots now (before the device blocks can be reused); `write_lower(hashes, blocks, tokens)` hands adopted
pages to the lower tier. The simulator passes neither and counts pages only.

A copy that raises fails nothing but itself: the host tier maps a page hash to its slot only once the copy of its
bytes succeeded (the pages of a failed copy are discarded, their slots free again, counted in `failed_copies` and
logged), and a device eviction always completes, so the tree's and the host tier's counters stay right.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from radixcache.cache import MatchResult, RadixCache
from radixcache.errors import RadixCacheError
from radixcache.node import TreeNode
from radixcache.page_hash import PageChain, PageHasher
from radixcache.tier.page_tier import PageTier

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
SELECTIVE_HITS = 2  # write_through_selective backs a page up once its node has been hit this often
log = logging.getLogger("radixcache.tier")


class LowerTier(Protocol):
    """What the tiered cache asks of the tier under the host: how many pages from the first exist."""

    def count_prefix(self, page_hashes: Sequence[bytes]) -> int: ...


@dataclass(frozen=True, slots=True)
class TierMatch:
    """Where the full pages of a query are. `device`: the tree's match (lock its node before anything may evict).
    Then `host_pages` pages held by the host right after it, then `lower_pages` held by the lower tier.
    `hashes`: the page hashes of the query's full pages up to the end of the lower-tier match."""

    device: MatchResult
    host_pages: int
    lower_pages: int
    hashes: list[bytes]

    @property
    def device_pages(self) -> int:
        return len(self.device.blocks)


class TieredCache:
    """A RadixCache with a host tier and a lower tier under it (both optional), and a write policy.

    It installs itself as the device tree's eviction listener. `fingerprint` goes into every page hash's root
    (radixcache.page_hash.root_hash), with the namespace; `hasher` shares one PageHasher with other consumers.
    """

    def __init__(
        self,
        device: RadixCache,
        *,
        host: PageTier | None = None,
        lower: LowerTier | None = None,
        write_policy: str = "write_through",
        fingerprint: str = "",
        copy_to_host: Callable[[list[int], list[int]], None] | None = None,
        write_lower: Callable[[list[bytes], list[int], Sequence[int]], None] | None = None,
        hasher: PageHasher | None = None,
    ) -> None:
        if write_policy not in WRITE_POLICIES:
            raise RadixCacheError(f"write_policy must be one of {', '.join(WRITE_POLICIES)}; got {write_policy!r}")
        # Checked here: a wrong object (host=64, meant as a size) failed only at the first eviction, inside allocate.
        if not isinstance(device, RadixCache):
            raise RadixCacheError(f"device must be a RadixCache, got {type(device).__name__}")
        if host is not None and not isinstance(host, PageTier):
            raise RadixCacheError(f"host must be a PageTier or None, got {type(host).__name__}")
        if lower is not None and not callable(getattr(lower, "count_prefix", None)):
            raise RadixCacheError(f"lower must be a tier with count_prefix (a LowerTier) or None, got {lower!r:.60}")
        self.device = device
        self.host = host
        self.lower = lower
        self.write_policy = write_policy
        self.fingerprint = fingerprint
        self.page_size = device.page_size
        self.copy_to_host = copy_to_host
        self.write_lower = write_lower
        self.hasher = hasher if hasher is not None else PageHasher(fingerprint, device.page_size)
        self.failed_copies = 0  # copies to the host that raised (their pages were discarded)
        if host is not None:
            device.on_evict = _weak_listener(self)

    # ------------------------------------------------------------------ lookups

    def chain(self, namespace: Hashable) -> PageChain:
        """A fresh hash chain for one sequence of `namespace` (keep one per request: it grows with it)."""
        return self.hasher.chain(namespace)

    def match(self, tokens: Sequence[int], namespace: Hashable = None, chain: PageChain | None = None) -> TierMatch:
        """The device match of `tokens` (RadixCache.match_prefix: it refreshes and may split), then the pages after
        it in the host and the lower tier. Under write_through_selective, pages hit twice are backed up here."""
        device = self.device.match_prefix(tokens, namespace=namespace)
        d = len(device.blocks)
        if self.write_policy == "write_through_selective" and self.host is not None and d:
            self._back_up_hot(device.node, tokens, namespace, chain)
        if self.host is None and self.lower is None:
            return TierMatch(device, 0, 0, [])
        full = len(tokens) // self.page_size
        if full <= d:
            return TierMatch(device, 0, 0, [])
        hashes = (chain or self.chain(namespace)).upto(tokens, full)
        host_pages = self.host.count_prefix(hashes, d) if self.host is not None else 0
        start = d + host_pages
        lower_pages = self.lower.count_prefix(hashes[start:]) if self.lower is not None and start < full else 0
        return TierMatch(device, host_pages, lower_pages, hashes[: start + lower_pages])

    # ------------------------------------------------------------------ pages going down

    def adopted(
        self, hashes: Sequence[bytes], blocks: Sequence[int], tokens: Sequence[int], parent: bytes | None = None
    ) -> None:
        """The tree just adopted these pages (their hashes, device blocks and concatenated tokens): copy them to
        the host under write_through, and hand them to the lower tier. `parent`: the hash of their run's page before
        them (None: they start it), the page the first of them goes just older than in the host (PageTier.store)."""
        if not hashes:
            return
        if self.host is not None and self.write_policy == "write_through":
            self._to_host(list(hashes), list(blocks), parent=parent, chained=True)
        if self.write_lower is not None:
            self.write_lower(list(hashes), list(blocks), tokens)

    def _to_host(
        self, hashes: list[bytes], blocks: Sequence[int], *, parent: bytes | None = None, chained: bool = False
    ) -> int:
        """Store pages in the host tier; copy those it did not hold. Returns how many were copied. A copy that
        raises discards the pages it was for (their slots hold no page's bytes) and returns 0: never raises.
        `chained`: the pages continue a run after `parent` (adopted): each is placed just older than the page before
        it, so the run keeps its last use's recency with its head newest; otherwise each is the newest, the first
        last."""
        assert self.host is not None
        new_hashes, new_blocks, new_slots = [], [], []
        # The head is the newest, so the LRU takes a run's later pages first (a tail without its head is never found),
        # and a batch larger than the tier's free room keeps its head: chained, stored head first, each just older
        # than the one before, up to the first the tier refuses; otherwise stored tail first, each the newest.
        pages = zip(hashes, blocks, strict=True) if chained else zip(reversed(hashes), reversed(blocks), strict=True)
        before = parent
        for page_hash, block in pages:
            placed = self.host.store(page_hash, before) if chained else self.host.store(page_hash)
            if placed is None and chained:
                break  # the pages after it would follow a gap
            before = page_hash
            if placed is not None and placed[1]:
                new_hashes.append(page_hash)
                new_blocks.append(block)
                new_slots.append(placed[0])
        if chained:  # page order, as below
            new_hashes, new_blocks, new_slots = new_hashes[::-1], new_blocks[::-1], new_slots[::-1]
        # A batch larger than the tier's free room evicted its own first stored pages to place the later ones: copy only
        # the pages still stored (in page order), so that no slot is written twice in one copy (whose order is then
        # undefined).
        kept = [i for i in reversed(range(len(new_hashes))) if new_hashes[i] in self.host]
        new_hashes, new_blocks, new_slots = ([xs[i] for i in kept] for xs in (new_hashes, new_blocks, new_slots))
        if new_blocks and self.copy_to_host is not None:
            try:
                self.copy_to_host(new_blocks, new_slots)
            except Exception as exc:
                for page_hash in new_hashes:
                    self.host.discard(page_hash)  # new pages are unlocked; one evicted meanwhile is simply gone
                self.failed_copies += 1
                log.warning(
                    "copy of %d page(s) to the %s tier failed; not cached there: %r",
                    len(new_hashes),
                    self.host.name,
                    exc,
                )
                return 0
        return len(new_blocks)

    def _on_device_evict(self, leaf: TreeNode, keep: int, blocks: Sequence[int]) -> None:
        """Device eviction: write_back copies the leaf's departing pages to the host; the other policies have
        copied what they keep already, so only the recency of those copies is refreshed."""
        if self.host is None:
            return
        try:
            hashes = self._node_hashes(leaf)[keep:]
            if self.write_policy == "write_back":
                self._to_host(hashes, blocks)
            else:
                self.host.touch(hashes)  # its copies were on the device until now: recently used
        except Exception:  # the tree is mid-eviction: it must finish, or its counters go wrong for good
            log.exception("the %s tier's eviction listener failed; the pages are dropped", self.host.name)

    def _back_up_hot(self, node: TreeNode, tokens: Sequence[int], namespace: Hashable, chain: PageChain | None) -> None:
        """Back up the matched pages whose nodes were hit at least SELECTIVE_HITS times (a prefix of the match:
        an ancestor is hit whenever a descendant is)."""
        assert self.host is not None
        hot = node
        while hot.parent is not None and hot.hit_count < SELECTIVE_HITS:
            hot = hot.parent
        if hot.parent is None:
            return
        pages = hot.end_len // self.page_size
        hashes = (chain or self.chain(namespace)).upto(tokens, pages)
        missing = [i for i, h in enumerate(hashes) if h not in self.host]
        if not missing:
            return
        blocks = _path_blocks(hot)
        self._to_host([hashes[i] for i in missing], [blocks[i] for i in missing])

    def _node_hashes(self, node: TreeNode) -> list[bytes]:
        """The hashes of `node`'s own pages (from the root's chain: the whole path is hashed)."""
        return self.hasher.node_hashes(node)

    def check_invariants(self) -> None:
        """Every tier's own conservation and structure."""
        self.device.check_invariants()
        for tier in (self.host, self.lower):
            check = getattr(tier, "check_invariants", None)
            if check is not None:
                check()


def _path_blocks(node: TreeNode) -> list[int]:
    """The device blocks of every page from the root to the end of `node`."""
    parts: list[list[int]] = []
    n: TreeNode | None = node
    while n is not None and n.parent is not None:
        parts.append(n.blocks)
        n = n.parent
    return [b for part in reversed(parts) for b in part]


def _weak_listener(tiered: TieredCache) -> Callable[[TreeNode, int, Sequence[int]], None]:
    """The device's eviction listener, holding `tiered` weakly: the device tree and its TieredCache would otherwise
    hold each other, a cycle that only the cyclic collector frees (an engine's tree and tier index outlived it)."""
    ref = weakref.WeakMethod(tiered._on_device_evict)

    def on_evict(leaf: TreeNode, keep: int, blocks: Sequence[int]) -> None:
        listener = ref()
        if listener is not None:  # the TieredCache is gone: nobody can read a host copy any more
            listener(leaf, keep, blocks)

    return on_evict
