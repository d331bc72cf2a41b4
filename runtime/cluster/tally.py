"""What the replicas did, as the front door reports it: their EngineStats summed (`sum_stats`; `Counters` keeps the
sum's counters from going back when a replica dies or restarts), and each replica's share of a replay
(`replica_rows`), counted from a baseline taken after the warm-up (`Baseline`), so the warm-up that reaches every
replica is not in the table, as it is not in a single engine's replay table."""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from radixcache import CacheStats
from radixcache.runtime.cluster.fanout import gather, read_wait
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
        return cls(cluster.each("counted_stats", wait=read_wait(cluster)), warm_keys)


def replica_rows(cluster: ReplicaCluster, baseline: Baseline) -> list[dict[str, Any]]:
    """Each live replica's share since `baseline`: requests routed to it, its prompt and cached tokens and their hit
    rate, and the pages the router's index holds for it, less the warm-up's. A replica alive but not answering
    within runtime.cluster.fanout.read_wait (frozen) has its row with None for the counts only it knows (the replay's
    table failed as a whole, after the run, with a traceback)."""
    # first: a replica found dead here leaves `stats` below too
    answers, silent = gather(cluster, "counted_stats", wait=read_wait(cluster))
    stats = cluster.stats()
    rows = []
    for replica in sorted([*answers, *silent]):
        prompt = cached = hit_rate = None
        if replica in answers:
            incarnation, s = answers[replica]
            prompt, cached = s.prompt_tokens, s.cached_tokens
            base = baseline.stats.get(replica)
            if base is not None and base[0] == incarnation:
                prompt, cached = prompt - base[1].prompt_tokens, cached - base[1].cached_tokens
            hit_rate = cached / prompt if prompt else 0.0
        warm = sum(cluster.index.holds(replica, key) for key in baseline.warm_keys)
        rows.append(
            {
                "replica": replica,
                "routed": stats.routed.get(replica, 0),
                "prompt_tokens": prompt,
                "cached_tokens": cached,
                "hit_rate": hit_rate,
                "indexed_pages": max(0, stats.index_pages.get(replica, 0) - warm),
            }
        )
    return rows


# EngineStats' gauges (a reading now, of the live replicas); every other field, and every field of its CacheStats and
# TierCounters, is a counter since the engine started.
GAUGES = (
    "capacity_blocks",
    "free_blocks",
    "evictable_blocks",
    "locked_blocks",
    "running",
    "waiting",
    "pinned_blocks",
    "leases",
    "threads",
    "disk_tier_up",
)


class Counters:
    """The replicas' EngineStats summed with counters that never go back (/metrics' `_total`s: Prometheus reads a
    drop as a counter reset and counts the whole value again). A plain sum of the live replicas' stats fell by a
    replica's counts when it died (it left the sum) and when Ray restarted it (its counts start from zero). Each
    replica process's (incarnation's) last counts are kept: a dead replica's stay in the sum, and a restarted
    one's new counts add to its earlier processes'. Gauges are the live replicas' now. What a replica counted after
    the last reading before it died is lost; nothing is counted twice. Two scrapes at once may apply their answers
    in either order: an answer older than one applied already takes no count back."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[str, Any]] = {}  # replica -> (incarnation, its stats at the last reading)
        self._ended: Any = None  # the last counts of every replica process that was followed by another, summed
        self._superseded: set[str] = set()  # those processes' incarnations
        self._lock = threading.Lock()

    def total(self, answers: dict[int, tuple[str, Any]]) -> Any:
        """The stats now, from the live replicas' `counted_stats` answers; ReplicaUnavailableError with none."""
        live = sum_stats([s for _, s in answers.values()])
        with self._lock:
            for replica, (incarnation, s) in answers.items():
                last = self._last.get(replica)
                if incarnation in self._superseded:  # an answer of a process already followed by another (a scrape
                    continue  # that asked before it, applied after): its counts are in `_ended` already
                if last is not None and last[0] == incarnation:  # an older answer never takes a count back
                    s = _fieldwise(last[1], s, max)
                elif last is not None:  # a new process: the old one's counts are final
                    self._ended = last[1] if self._ended is None else _add(self._ended, last[1])
                    self._superseded.add(last[0])
                self._last[replica] = (incarnation, s)
            counted = sum_stats([s for _, s in self._last.values()] + ([] if self._ended is None else [self._ended]))
        return replace(counted, **{name: getattr(live, name) for name in GAUGES})


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
    return _fieldwise(a, b, operator.add)


def _fieldwise(a: Any, b: Any, op: Callable[[Any, Any], Any]) -> Any:
    """`op` of two EngineStats (or CacheStats) field by field, into nested ones too; None stays None."""
    values = {}
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            values[name] = op(x, y)
        elif isinstance(x, CacheStats) or hasattr(x, "__dataclass_fields__"):
            values[name] = _fieldwise(x, y, op) if y is not None else x
        else:
            values[name] = x
    return replace(a, **values)
