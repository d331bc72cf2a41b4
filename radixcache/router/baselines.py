"""The cache-blind baselines: round robin, least loaded (in tokens of work), and power of two choices."""

from __future__ import annotations

import random
from collections.abc import Sequence

from radixcache.router.base import Router, check_replicas
from radixcache.router.errors import RouterError
from radixcache.router.index import RouterIndex
from radixcache.router.load import LoadTracker, RouteRequest


class RoundRobinRouter(Router):
    """Each request to the next replica of the routing set, cycling: the i-th call returns replicas[i % n]."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker) -> int:
        check_replicas(replicas)
        replica = replicas[self._next % len(replicas)]
        self._next += 1
        return replica


class LeastLoadedRouter(Router):
    """The replica with the least work (`LoadTracker.work`: pending tokens weighed by their cost); ties to the
    lower id."""

    name = "least_loaded"

    def choose(self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker) -> int:
        check_replicas(replicas)
        return min(replicas, key=lambda r: (loads.work(r), r))


class PowerOfTwoRouter(Router):
    """Two distinct replicas drawn at random (a generator seeded with `seed`), and the one with less work of the
    two (ties to the lower id). With one replica, that one."""

    name = "power_of_two"

    def __init__(self, seed: int = 0) -> None:
        if type(seed) is not int:  # random.Random takes a bool, a float or a str as a seed, each silently
            raise RouterError(f"power_of_two: seed must be an int, got {seed!r}")
        self.seed = seed
        self._rng = random.Random(seed)

    def choose(self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker) -> int:
        check_replicas(replicas)
        if len(replicas) == 1:
            return replicas[0]
        a, b = self._rng.sample(range(len(replicas)), 2)
        return min(replicas[a], replicas[b], key=lambda r: (loads.work(r), r))

    def __repr__(self) -> str:
        return f"PowerOfTwoRouter(seed={self.seed!r})"
