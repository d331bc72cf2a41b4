"""SGLang's cache-aware rule, with its defaults: the anchor to beat.

SGLang's router (sgl-router, policy `cache_aware`) keeps one approximate tree per worker and counts load in
requests, and inserts each prompt into the chosen worker's tree as it routes it. Here it reads the same exact
index as every policy, plus the prefixes of requests in flight on each replica (radixcache.router.inflight: what
SGLang's insertion at routing time gives it), so it is never worse informed than ours; its tree size is the
replica's indexed pages plus the pages in flight there. Its load is the requests dispatched to a replica and not
finished (`LoadTracker.running`), as SGLang's router counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

from radixcache.router.base import Route, Router, check_replicas
from radixcache.router.errors import RouterError
from radixcache.router.index import RouterIndex
from radixcache.router.inflight import InFlightPrefixes
from radixcache.router.load import LoadTracker, RouteRequest


class SGLangRouter(Router):
    """Three branches, in order:

    1. Imbalanced, when (max - min) running requests > `balance_abs` and max > `balance_rel` * min: the replica
       with the fewest running requests (shortest queue), whatever it caches.
    2. Otherwise, when the best match covers more than `cache_threshold` of the prompt (matched pages times page
       size over prompt tokens): the best-matching replica.
    3. Otherwise: the replica with the smallest tree (fewest cached pages), however busy it is.

    Ties go to the lower id. The complaints users make are in the branches: 3 sends a miss to a replica that may
    be the busiest, 1 throws affinity away, and both count requests, not tokens.
    """

    name = "sglang"

    def __init__(
        self, cache_threshold: float = 0.3, balance_abs: int = 64, balance_rel: float = 1.5, in_flight: bool = True
    ) -> None:
        numbers = (cache_threshold, balance_abs, balance_rel)  # a bool or a string: a number by accident, or TypeError
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in numbers):
            raise RouterError(f"sglang: cache_threshold, balance_abs and balance_rel must be numbers, got {numbers!r}")
        if not 0 <= cache_threshold <= 1:
            raise RouterError(f"sglang: cache_threshold must be in [0, 1], got {cache_threshold!r}")
        if not (0 <= balance_abs < math.inf and 1 <= balance_rel < math.inf):  # NaN would never find an imbalance
            raise RouterError(
                f"sglang: need finite balance_abs >= 0 and balance_rel >= 1, got {balance_abs}, {balance_rel}"
            )
        if not isinstance(in_flight, bool):  # "no" is truthy: in-flight tracking on, silently
            raise RouterError(f"sglang: in_flight must be True or False, got {in_flight!r}")
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.in_flight = InFlightPrefixes() if in_flight else None

    def branch(self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker) -> str:
        """Which branch `choose` would take: "imbalanced", "cache" or "smallest_tree" (records nothing)."""
        return self._decide(request, replicas, index, loads)[0]

    def choose(self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker) -> int:
        return self.route(request, replicas, index, loads).replica

    def route(self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker) -> Route:
        _, replica, matched = self._decide(request, replicas, index, loads)
        if self.in_flight is not None:
            self.in_flight.add(replica, request.page_keys, request.rid)
        return Route(replica, matched[replica])

    def _decide(
        self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker
    ) -> tuple[str, int, dict[int, int]]:
        check_replicas(replicas)
        keys = request.page_keys
        pending = self.in_flight
        matched: dict[int, int] = {}
        for r in replicas:
            m = index.matched_pages(r, keys)
            if pending is not None:
                pending.sync(r, loads.running(r), partial(loads.holds, r))
                m = max(m, pending.matched_pages(r, keys))
            matched[r] = m
        running = [loads.running(r) for r in replicas]
        high, low = max(running), min(running)
        if high - low > self.balance_abs and high > self.balance_rel * low:
            return "imbalanced", min(zip(running, replicas, strict=True))[1], matched
        best = min(replicas, key=lambda r: (-matched[r], r))
        prompt = request.prompt_tokens
        rate = min(matched[best] * request.page_size, prompt) / prompt if prompt else 0.0
        if rate > self.cache_threshold:
            return "cache", best, matched
        return "smallest_tree", min(replicas, key=lambda r: (self.tree_pages(r, index), r)), matched

    def tree_pages(self, replica: int, index: RouterIndex) -> int:
        """The size of `replica`'s tree as SGLang sees it: its indexed pages plus the pages routed there in flight
        (a key in both counts twice, as SGLang's tree, trimmed only now and then, overcounts too)."""
        return index.pages(replica) + (self.in_flight.pages(replica) if self.in_flight is not None else 0)

    def forget(self, replica: int) -> None:
        """Drop the prefixes in flight on `replica` (it left the routing set)."""
        if self.in_flight is not None:
            self.in_flight.forget(replica)

    def __repr__(self) -> str:
        return (
            f"SGLangRouter(cache_threshold={self.cache_threshold!r}, balance_abs={self.balance_abs!r}, "
            f"balance_rel={self.balance_rel!r})"
        )
