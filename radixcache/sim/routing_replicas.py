"""One simulated engine replica of a routing replay (`Replica`: its cache, its FIFO queue, the page keys it
published) and a request in flight on it (`Job`)."""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Hashable, Sequence

from radixcache.blocks import block_ids
from radixcache.cache import RadixCache
from radixcache.policy.base import EvictionPolicy
from radixcache.policy.registry import make_policy
from radixcache.trace.workload import SimRequest


class Job:
    """A request in flight on a replica."""

    __slots__ = ("arrival", "blocks", "chain", "full", "keys", "node", "out", "prompt_pages", "request", "rid")

    def __init__(self, rid: int, arrival: float, request: SimRequest, out: int, keys: list, chain: object) -> None:
        self.rid = rid
        self.arrival = arrival
        self.request = request
        self.out = out
        self.keys = keys  # the prompt's page keys, as routed
        self.chain = chain  # the page-key chain of a token request (PageChain), None for a hash request
        self.node = None
        self.full = None
        self.blocks: array = block_ids()
        self.prompt_pages = 0


class Replica:
    """One simulated engine: its cache, its FIFO queue, what it published, and its counters."""

    __slots__ = (
        "busy",
        "busy_s",
        "cache",
        "held",
        "hit_tokens",
        "id",
        "key_of_block",
        "prompt_tokens",
        "queue",
        "removed",
        "requests",
        "seq",
        "ttft_s",
    )

    def __init__(self, replica: int, capacity: int, page_size: int, policy: str | EvictionPolicy) -> None:
        self.id = replica
        self.cache = RadixCache(capacity, page_size=page_size, policy=make_policy(policy))
        # The page key each tree block holds, by block id: a dict, so memory grows with the blocks in the tree, not
        # the capacity (a list of `capacity` was a MemoryError at a capacity the tree itself takes).
        self.key_of_block: dict[int, Hashable] = {}
        self.held: dict[Hashable, int] = {}  # key -> tree blocks holding it (1 unless ids are not chained)
        self.removed: list[Hashable] = []  # keys gone since the last batch (on_evict appends)
        self.seq = 0
        self.queue: deque[Job] = deque()
        self.busy = False
        self.busy_s = self.ttft_s = 0.0
        self.requests = self.prompt_tokens = self.hit_tokens = 0
        self.cache.on_evict = self._evicted

    def _evicted(self, leaf: object, keep: int, blocks: Sequence[int]) -> None:
        held, key_of = self.held, self.key_of_block
        for b in blocks:
            key = key_of.pop(b)
            n = held[key] - 1
            if n:
                held[key] = n
            else:
                del held[key]
                self.removed.append(key)

    def adopted(self, keys: list, blocks: Sequence[int]) -> list:
        """Record that the tree adopted `blocks` holding `keys`; the keys it did not hold before."""
        held, key_of = self.held, self.key_of_block
        stored = []
        for key, b in zip(keys, blocks, strict=True):
            key_of[b] = key
            n = held.get(key, 0)
            held[key] = n + 1
            if not n:
                stored.append(key)
        return stored
