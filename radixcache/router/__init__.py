"""Routing requests across engine replicas by what each one caches (pure Python; never imports torch).

- `events`: `EventBatch`, what a replica publishes (page keys stored and removed, numbered for gap detection).
- `index`: `RouterIndex`, the exact set of page keys per replica, kept by those batches.
- `load`: `RouteRequest`, `ReplicaLoad` and `LoadTracker`: load in tokens of work, not requests.
- `baselines`, `consistent_hash`, `sglang`, `cache_aware`: the policies; `registry`: `make_router`, `ROUTERS`.

docs/routing.md describes each policy, the events and the simulator that compares them.
"""

from __future__ import annotations

from radixcache.router.base import Route, Router
from radixcache.router.baselines import LeastLoadedRouter, PowerOfTwoRouter, RoundRobinRouter
from radixcache.router.cache_aware import CacheAwareRouter, ReplicaScore
from radixcache.router.consistent_hash import ConsistentHashRouter
from radixcache.router.errors import RouterError
from radixcache.router.events import EventBatch, PageKey
from radixcache.router.index import IndexStats, RouterIndex
from radixcache.router.inflight import InFlightPrefixes
from radixcache.router.load import (
    DEFAULT_DECODE_COST,
    DEFAULT_PREFILL_COST,
    LoadTracker,
    ReplicaLoad,
    RouteRequest,
)
from radixcache.router.registry import ROUTERS, make_router
from radixcache.router.sglang import SGLangRouter

__all__ = [
    "DEFAULT_DECODE_COST",
    "DEFAULT_PREFILL_COST",
    "ROUTERS",
    "CacheAwareRouter",
    "ConsistentHashRouter",
    "EventBatch",
    "InFlightPrefixes",
    "IndexStats",
    "LeastLoadedRouter",
    "LoadTracker",
    "PageKey",
    "PowerOfTwoRouter",
    "ReplicaLoad",
    "ReplicaScore",
    "RoundRobinRouter",
    "Route",
    "RouteRequest",
    "Router",
    "RouterError",
    "RouterIndex",
    "SGLangRouter",
    "make_router",
]
