"""The interface every routing policy implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

from radixcache.router.errors import RouterError
from radixcache.router.index import RouterIndex
from radixcache.router.load import LoadTracker, RouteRequest


class Route(NamedTuple):
    """Where a request goes, and how many of its pages the router expects that replica to serve from its cache
    (what the caller dispatches with: `LoadTracker.dispatched(r, rid, request.uncached_tokens(matched_pages), ...)`)."""

    replica: int
    matched_pages: int


class Router(ABC):
    """A routing policy: `choose` names the replica a request goes to.

    `replicas` is the routing set now (the caller drops dead replicas from it); `choose` returns one of them and
    never anything else. A router may keep state between calls (a cursor, a seeded generator, the replica each
    session used last), bounded in size; it holds no global state, so two routers never interfere.
    """

    name: ClassVar[str]

    @abstractmethod
    def choose(self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker) -> int:
        """The replica `request` goes to, out of `replicas`. Raises RouterError when `replicas` is empty."""

    def route(self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker) -> Route:
        """`choose`, with the pages the chosen replica is expected to hold (the index's match, unless the policy
        knows better: cache_aware and sglang add prefixes in flight there). Call one of `choose` and `route` per
        request, never both: a router may record its choice."""
        replica = self.choose(request, replicas, index, loads)
        return Route(replica, index.matched_pages(replica, request.page_keys))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def check_replicas(replicas: Sequence[int]) -> None:
    if not replicas:
        raise RouterError("no replica to route to")
