"""What the replicas did, as the front door reports it: their EngineStats summed (`sum_stats`), and each replica's
share of a replay (`replica_rows`), counted from a baseline taken after the warm-up (`Baseline`), so the warm-up
that reaches every replica is not in the table, as it is not in a single engine's replay table."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from radixcache import CacheStats
from radixcache.runtime.engine.errors import ReplicaUnavailableError

if TYPE_CHECKING:
    from radixcache.runtime.cluster.cluster import ReplicaCluster


@dataclass
class Baseline:
    """Each replica's (incarnation, EngineStats) when the measured run began, and the page keys of the warm-up it
    served then. A replica missing here, or of another incarnation (Ray restarted it since: its counts start again
    from zero over an empty cache), is counted from zero."""

    stats: dict[int, tuple[str, Any]] = field(default_factory=dict)
    warm_keys: tuple[bytes, ...] = ()

    @classmethod
    def take(cls, cluster: ReplicaCluster, warm_keys: tuple[bytes, ...] = ()) -> Baseline:
        return cls(cluster.each("counted_stats"), warm_keys)


def replica_rows(cluster: ReplicaCluster, baseline: Baseline) -> list[dict[str, Any]]:
    """Each live replica's share since `baseline`: requests routed to it, its prompt and cached tokens and their hit
    rate, and the pages the router's index holds for it, less the warm-up's."""
    answers = cluster.each("counted_stats")  # first: a replica found dead here leaves `stats` below too
    stats = cluster.stats()
    rows = []
    for replica, (incarnation, s) in answers.items():
        prompt, cached = s.prompt_tokens, s.cached_tokens
        base = baseline.stats.get(replica)
        if base is not None and base[0] == incarnation:
            prompt, cached = prompt - base[1].prompt_tokens, cached - base[1].cached_tokens
        warm = sum(cluster.index.holds(replica, key) for key in baseline.warm_keys)
        rows.append(
            {
                "replica": replica,
                "routed": stats.routed.get(replica, 0),
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "hit_rate": cached / prompt if prompt else 0.0,
                "indexed_pages": max(0, stats.index_pages.get(replica, 0) - warm),
            }
        )
    return rows


def sum_stats(parts: list[Any]) -> Any:
    """The replicas' EngineStats summed (gauges too: the cluster's pages, running and waiting)."""
    if not parts:
        raise ReplicaUnavailableError("no live engine replica")
    total = parts[0]
    for s in parts[1:]:
        total = _add(total, s)
    return total


def _add(a: Any, b: Any) -> Any:
    """Two EngineStats (or CacheStats) summed field by field; None stays None."""
    values = {}
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            values[name] = x + y
        elif isinstance(x, CacheStats) or hasattr(x, "__dataclass_fields__"):
            values[name] = _add(x, y) if y is not None else x
        else:
            values[name] = x
    return replace(a, **values)
