"""An engine's cache events for a router: the chained hashes of the pages its tree adopts and evicts, in numbered
batches (radixcache.router.EventBatch), with a short history for receivers that fell behind and a snapshot for those
that fell further.

The keys are radixcache.page_hash chained hashes, rooted in the engine's KV fingerprint and the namespace, so a
front door that hashes a prompt the same way asks a replica's index exactly which of its prefixes are cached.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable, Sequence

from radixcache import RadixCache, TreeNode
from radixcache.page_hash import PageChain, PageHasher
from radixcache.router import EventBatch


class KVEventLog:
    """Stored and removed page keys of one engine's tree, batched and numbered 1, 2, 3, ...

    Invariants: `keys` is exactly the set of pages in the tree (each adopted page is stored once; each evicted page is
    removed once), and after batch `seq` a receiver that applied batches 1..seq holds the same set. The engine loop
    thread records (`stored`, the eviction listener); any thread reads (`take`, `since`, `snapshot`) under the lock.
    `history` batches are kept for `since`; a receiver further behind resyncs from `snapshot`.
    """

    def __init__(
        self,
        cache: RadixCache,
        fingerprint: str,
        *,
        replica: int = 0,
        history: int = 256,
        hasher: PageHasher | None = None,
    ) -> None:
        self.replica = replica
        self.page_size = cache.page_size
        self.fingerprint = fingerprint
        self._lock = threading.Lock()
        self._keys: set[bytes] = set()
        # The open batch. A receiver applies a batch's removals before its stores, so a key stored and then evicted
        # within one batch must leave it unpublished (not appear in both); one evicted, then stored again, is in both.
        self._stored: dict[bytes, None] = {}
        self._removed: list[bytes] = []
        self._seq = 0
        self._history: deque[EventBatch] = deque(maxlen=history)
        # Shared with the tiers when they run too, so a leaf both listeners hash is hashed once.
        self.hasher = hasher if hasher is not None else PageHasher(fingerprint, cache.page_size)
        previous = cache.on_evict  # the tiers' listener, if any, keeps running first

        def on_evict(leaf: TreeNode, keep: int, blocks: Sequence[int]) -> None:
            if previous is not None:
                previous(leaf, keep, blocks)
            self._evicted(leaf, keep)

        cache.on_evict = on_evict

    def chain(self, namespace: Hashable) -> PageChain:
        return self.hasher.chain(namespace)

    # ------------------------------------------------------------------ recording (engine loop thread)

    def stored(self, hashes: Sequence[bytes]) -> None:
        """The tree adopted pages with these keys."""
        with self._lock:
            for h in hashes:
                if h not in self._keys:
                    self._keys.add(h)
                    self._stored[h] = None

    def _evicted(self, leaf: TreeNode, keep: int) -> None:
        hashes = self.hasher.node_hashes(leaf)[keep:]
        with self._lock:
            for h in hashes:
                if h in self._keys:
                    self._keys.discard(h)
                    if h in self._stored:  # never published: it simply never was
                        del self._stored[h]
                    else:
                        self._removed.append(h)

    # ------------------------------------------------------------------ reading (any thread)

    def take(self) -> EventBatch | None:
        """Close the events recorded since the last batch into the next numbered batch (None when there are none)."""
        with self._lock:
            if not self._stored and not self._removed:
                return None
            self._seq += 1
            batch = EventBatch(self.replica, self._seq, tuple(self._stored), tuple(self._removed))
            self._stored, self._removed = {}, []
            self._history.append(batch)
            return batch

    def since(self, seq: int) -> list[EventBatch] | None:
        """Every batch after `seq` (closing the open one first), or None when some of them are no longer kept: the
        receiver must resync from `snapshot`."""
        self.take()
        with self._lock:
            if seq >= self._seq:
                return []
            kept = list(self._history)
            if not kept or kept[0].seq > seq + 1:
                return None
            return [b for b in kept if b.seq > seq]

    def snapshot(self) -> tuple[int, frozenset[bytes]]:
        """(seq, keys): every page key the tree holds, as of batch `seq` (the open batch is closed first)."""
        self.take()
        with self._lock:
            return self._seq, frozenset(self._keys)

    def set_history(self, batches: int) -> None:
        """Keep the last `batches` batches for `since` (at least 1)."""
        with self._lock:
            self._history = deque(self._history, maxlen=max(1, batches))

    @property
    def seq(self) -> int:
        return self._seq

    def __len__(self) -> int:
        return len(self._keys)
