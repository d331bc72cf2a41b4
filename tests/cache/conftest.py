"""Helpers shared by the cache tests, exposed as fixtures (importlib mode keeps test modules apart)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import pytest

from radixcache import RadixCache


def page_map(cache: RadixCache) -> dict[tuple[Hashable, tuple[int, ...]], int]:
    """Every cached page-aligned prefix, as (namespace, tokens) -> block id of its last page.

    Read from the public node API (iter_nodes, TreeNode.tokens/blocks/namespace), for comparing against expectations.
    """
    p = cache.page_size
    pages: dict[tuple[Hashable, tuple[int, ...]], int] = {}
    for node in cache.iter_nodes():
        path = tuple(node.tokens())
        start = len(path) - len(node.key)
        for i, block in enumerate(node.blocks):
            pages[(node.namespace, path[: start + (i + 1) * p])] = block
    return pages


def cache_state(cache: RadixCache) -> dict[str, Any]:
    """Everything an erroring call must leave untouched: counters, stats, the node set and the block states."""
    cache.check_invariants()
    nodes = sorted(
        (
            node.uid,
            repr(node.namespace),
            tuple(node.tokens()),
            tuple(node.blocks),
            node.lock_ref,
            node.hit_count,
            node.last_access,
            node.created,
            id(node),
        )
        for node in cache.iter_nodes()
    )
    return {
        "free": cache.free_blocks,
        "evictable": cache.evictable_blocks,
        "locked": cache.locked_blocks,
        "held": cache.held_blocks,
        "stats": cache.stats,
        "nodes": nodes,
        "namespaces": cache.namespaces(),
        # private, read only: an erroring call must not tick the logical clock or reorder the free list
        "clock": cache._clock,
        "free_list": cache._pool.free_list(),
    }


@pytest.fixture
def state_of() -> Callable[[RadixCache], dict[str, Any]]:
    return cache_state


@pytest.fixture
def pages_of() -> Callable[[RadixCache], dict[tuple[Hashable, tuple[int, ...]], int]]:
    return page_map
