"""The policies usable by name: `make_policy("lru")` and the tables the CLI and the simulator list."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from radixcache.errors import PolicyError
from radixcache.policy.base import EvictionPolicy
from radixcache.policy.classic import CostAwarePolicy, FIFOPolicy, LFUPolicy, LRUPolicy, SLRUPolicy
from radixcache.policy.lease import AgentPolicy, TLRUPolicy
from radixcache.policy.reuse import ReusePolicy

POLICIES: Mapping[str, type[EvictionPolicy]] = MappingProxyType(
    {cls.name: cls for cls in (LRUPolicy, LFUPolicy, FIFOPolicy, SLRUPolicy, CostAwarePolicy)}
)
#: this project's learned and lease-hinted policies (radixcache.policy.reuse, .lease), usable by name everywhere; out
#: of POLICIES because their keys drift with what they learn or the hint given, which the fixed-order tests of
#: tests/cache do not allow
EXPERIMENTAL_POLICIES: Mapping[str, type[EvictionPolicy]] = MappingProxyType(
    {cls.name: cls for cls in (ReusePolicy, TLRUPolicy, AgentPolicy)}
)
ALL_POLICIES: Mapping[str, type[EvictionPolicy]] = MappingProxyType({**POLICIES, **EXPERIMENTAL_POLICIES})


def make_policy(policy: str | EvictionPolicy) -> EvictionPolicy:
    """A fresh policy instance for a name in `ALL_POLICIES`, or the given instance itself."""
    if isinstance(policy, EvictionPolicy):
        return policy
    if isinstance(policy, str) and policy.lower() in ALL_POLICIES:
        return ALL_POLICIES[policy.lower()]()
    raise PolicyError(f"unknown eviction policy {policy!r}; choose one of {', '.join(sorted(ALL_POLICIES))}")
