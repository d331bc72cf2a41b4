"""What a replica publishes about its cache: batches of stored and removed page keys, numbered in order.

Modelled on vLLM's KV events (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`, batched with sequence numbers).
A page key is a *chained* page hash: `bytes` from radixcache.page_hash in the runtime, or an int (a hash trace's
id) in the simulator. Keys are opaque hashables to the router; since each names its whole prefix, the set of
keys a replica holds says exactly which prefixes it caches.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from radixcache.router.errors import RouterError

#: a page's chained hash: bytes (radixcache.page_hash) or an int (a hash trace's id); opaque to the router
PageKey = Hashable


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One batch of one replica's cache events.

    Invariants: `seq` numbers a replica's batches 1, 2, 3, ... with no gap, so a receiver that sees a gap knows it
    missed one and must resync. Applied in this order: `cleared` (every key the replica held goes), then
    `removed`, then `stored`. Removing a key not held and storing a key already held change nothing (set semantics).
    """

    replica: int
    seq: int
    stored: tuple[PageKey, ...] = ()
    removed: tuple[PageKey, ...] = ()
    cleared: bool = False

    def __post_init__(self) -> None:
        for name in ("replica", "seq"):
            value = getattr(self, name)
            if type(value) is not int or value < (1 if name == "seq" else 0):
                low = "a positive" if name == "seq" else "a non-negative"
                raise RouterError(f"EventBatch.{name} must be {low} int, got {value!r}")
        for name in ("stored", "removed"):
            if not isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def events(self) -> int:
        """Page events in the batch: keys stored plus keys removed (a clear counts as one)."""
        return len(self.stored) + len(self.removed) + self.cleared
