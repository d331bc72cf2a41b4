"""The page-tier model that the runtime and the simulator share: which chained page hash is on which tier.

- `page_tier`: `PageTier`, one lower tier (host or disk) as a map from page hash to slot, with its LRU order.
- `tiered_cache`: `TieredCache`, the device tree plus its lower tiers, and the write policies that back pages up.

Bytes never live here: the runtime moves them (`radixcache.runtime.kv`), the simulator prices them
(`radixcache.sim.tiers`).
"""

from __future__ import annotations

from radixcache.tier.page_tier import PageTier, TierStats
from radixcache.tier.tiered_cache import SELECTIVE_HITS, WRITE_POLICIES, LowerTier, TieredCache, TierMatch

__all__ = ["SELECTIVE_HITS", "WRITE_POLICIES", "LowerTier", "PageTier", "TierMatch", "TierStats", "TieredCache"]
