"""Routers by name: `make_router("cache_aware", session_slack=0.5)`."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from radixcache.router.base import Router
from radixcache.router.baselines import LeastLoadedRouter, PowerOfTwoRouter, RoundRobinRouter
from radixcache.router.cache_aware import CacheAwareRouter
from radixcache.router.consistent_hash import ConsistentHashRouter
from radixcache.router.errors import RouterError
from radixcache.router.sglang import SGLangRouter

_CLASSES: Mapping[str, type[Router]] = MappingProxyType(
    {
        cls.name: cls
        for cls in (
            RoundRobinRouter,
            LeastLoadedRouter,
            PowerOfTwoRouter,
            ConsistentHashRouter,
            SGLangRouter,
            CacheAwareRouter,
        )
    }
)

#: the routers' names, baselines first and ours last
ROUTERS: tuple[str, ...] = tuple(_CLASSES)


def make_router(name: str, **params: object) -> Router:
    """A fresh router called `name` (one of ROUTERS) with `params` (its constructor's keywords). Raises
    RouterError for an unknown name or parameter."""
    cls = _CLASSES.get(name)
    if cls is None:
        raise RouterError(f"unknown router {name!r}; choose one of {', '.join(ROUTERS)}")
    try:
        return cls(**params)
    except TypeError as exc:
        raise RouterError(f"{name}: {exc}") from None
