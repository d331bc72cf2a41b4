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
from radixcache.moved import install as _install_moved_paths
from radixcache.node import TreeNode
from radixcache.policy.base import EvictionPolicy
from radixcache.policy.classic import CostAwarePolicy, FIFOPolicy, LFUPolicy, LRUPolicy, SLRUPolicy
from radixcache.policy.registry import POLICIES, make_policy
from radixcache.stats import CacheStats

_install_moved_paths()  # the old import paths (radixcache.simulate, ...): radixcache.moved

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
