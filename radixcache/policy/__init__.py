"""Eviction and admission policies: strategies the tree asks, never the tree itself.

- `base`: the `EvictionPolicy` protocol (a leaf -> a sortable priority, smallest evicted first).
- `classic`: LRU, LFU, FIFO, SLRU and cost-aware (GreedyDual) priorities.
- `reuse`: the learned policy that ranks a leaf by its predicted chance of reuse.
- `registry`: the policies usable by name (`make_policy("lru")`).
- `admission`: how much of a finished request the tree adopts (page admission, not the engine's queue bound).

Belady's optimum is not here: it needs the future, so it lives with the simulator (`radixcache.sim.belady`).
"""

from __future__ import annotations

from radixcache.policy.admission import ADMISSION_POLICIES, AdmissionPolicy, AdmissionRequest, make_admission
from radixcache.policy.base import EvictionPolicy
from radixcache.policy.classic import CostAwarePolicy, FIFOPolicy, LFUPolicy, LRUPolicy, SLRUPolicy
from radixcache.policy.registry import ALL_POLICIES, EXPERIMENTAL_POLICIES, POLICIES, make_policy
from radixcache.policy.reuse import ReusePolicy

__all__ = [
    "ADMISSION_POLICIES",
    "ALL_POLICIES",
    "EXPERIMENTAL_POLICIES",
    "POLICIES",
    "AdmissionPolicy",
    "AdmissionRequest",
    "CostAwarePolicy",
    "EvictionPolicy",
    "FIFOPolicy",
    "LFUPolicy",
    "LRUPolicy",
    "ReusePolicy",
    "SLRUPolicy",
    "make_admission",
    "make_policy",
]
