"""The exception hierarchy of the cache.

Every error is raised before the cache changes, so the tree, the block states and the counters are exactly
as they were before the failing call.
"""

from __future__ import annotations


class RadixCacheError(Exception):
    """Base class of every error the cache raises on bad input or impossible requests."""


class InvalidTokensError(RadixCacheError, ValueError):
    """Tokens are not a sequence of non-negative integers that fit in 64 bits."""


class BlockCountError(RadixCacheError, ValueError):
    """The number of blocks given does not match the number of pages the tokens need."""


class BlockStateError(RadixCacheError, ValueError):
    """A block id is out of range, repeated, already free, or owned by the tree where the call needs a held block."""


class LockError(RadixCacheError):
    """Unlocking a node below zero, or locking a node that has been evicted."""


class CacheFullError(RadixCacheError):
    """An allocation needs more blocks than are free plus evictable (or more than the capacity)."""


class PolicyError(RadixCacheError, ValueError):
    """An unknown eviction policy name, or an object that is not a policy."""
