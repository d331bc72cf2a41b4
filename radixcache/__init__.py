"""radixcache: a radix-tree prefix KV cache over token ids. Pure Python; never imports torch."""

from __future__ import annotations

from radixcache.cache import MatchResult, RadixCache
from radixcache.errors import (
    BlockCountError,
    BlockStateError,
    CacheFullError,
    InvalidTokensError,
    LockError,
    PolicyError,
    RadixCacheError,
)
from radixcache.node import TreeNode
from radixcache.policies import (
    POLICIES,
    CostAwarePolicy,
    EvictionPolicy,
    FIFOPolicy,
    LFUPolicy,
    LRUPolicy,
    SLRUPolicy,
    make_policy,
)
from radixcache.stats import CacheStats

__all__ = [
    "POLICIES",
    "BlockCountError",
    "BlockStateError",
    "CacheFullError",
    "CacheStats",
    "CostAwarePolicy",
    "EvictionPolicy",
    "FIFOPolicy",
    "InvalidTokensError",
    "LFUPolicy",
    "LRUPolicy",
    "LockError",
    "MatchResult",
    "PolicyError",
    "RadixCache",
    "RadixCacheError",
    "SLRUPolicy",
    "TreeNode",
    "make_policy",
]

__version__ = "0.1.0"
