"""What a routing replay reports (`RoutingResult`, with one `ReplicaResult` per replica and the index's
`EventStats`), and the service costs of its queueing model (`RoutingCosts`)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from radixcache.errors import RadixCacheError
from radixcache.sim.tiers import DEFAULT_TIER_COSTS, MAX_COST_MS, TtftSummary

#: one request's share of a batched decode step on this project's CPU (the Engine's batch-8 aggregate, about 162
#: tokens/s in docs/benchmarks.md); radixcache.router's DEFAULT_DECODE_COST in milliseconds
DEFAULT_DECODE_MS_PER_TOKEN = 6.2


@dataclass(frozen=True, slots=True)
class RoutingCosts:
    """The queueing model's service costs, in milliseconds per token (defaults: radixcache.router.load's)."""

    prefill_ms_per_token: float = DEFAULT_TIER_COSTS.prefill_ms_per_token
    decode_ms_per_token: float = DEFAULT_DECODE_MS_PER_TOKEN

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_COST_MS:
                raise RadixCacheError(f"{f.name} must be a number in [0, {MAX_COST_MS:g}] ms, got {value!r}")


DEFAULT_ROUTING_COSTS = RoutingCosts()


@dataclass(frozen=True, slots=True)
class ReplicaResult:
    """One replica's share of a routing replay."""

    replica: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    busy_s: float  # time in service: the sum of its requests' service times
    ttft_mean_s: float
    evicted_blocks: int
    cached_pages: int  # pages in its cache (and its index entry) at the end

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "replica": self.replica,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "busy_s": self.busy_s,
            "ttft_mean_s": self.ttft_mean_s,
            "evicted_blocks": self.evicted_blocks,
            "cached_pages": self.cached_pages,
        }


@dataclass(frozen=True, slots=True)
class EventStats:
    """What the replicas published to the index, over the simulated time from the first arrival to the last
    finish, and the index's size."""

    batches: int
    events: int  # page keys stored plus page keys removed
    simulated_s: float
    peak_index_pages: int  # keys held over all replicas, at most
    index_memory_bytes: int  # RouterIndex.memory_bytes() at the end

    @property
    def events_per_s(self) -> float:
        return self.events / self.simulated_s if self.simulated_s > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.simulated_s if self.simulated_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class RoutingResult:
    """One routing replay. `imbalance`: the busiest replica's busy time over the mean busy time (1 is perfect)."""

    router: str
    num_replicas: int
    capacity_blocks: int
    policy: str
    block_tokens: int
    costs: RoutingCosts
    rate: float | None  # requests/s, or None for the trace's timestamps
    requests: int
    prompt_tokens: int
    hit_tokens: int
    ttft: TtftSummary
    replicas: tuple[ReplicaResult, ...]
    events: EventStats
    seconds: float  # wall time of the replay

    @property
    def hit_rate(self) -> float:
        """The cluster's hit rate: hit tokens over prompt tokens, over all replicas."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def utilisation(self) -> float:
        """The replicas' mean busy time over the simulated time (from the first arrival to the last finish)."""
        busy = [r.busy_s for r in self.replicas]
        span = self.events.simulated_s
        return sum(busy) / len(busy) / span if busy and span > 0 else 0.0

    @property
    def imbalance(self) -> float:
        busy = [r.busy_s for r in self.replicas]
        mean = sum(busy) / len(busy) if busy else 0.0
        return max(busy) / mean if mean > 0 else 1.0

    def as_dict(self) -> dict:
        """The keys of `radixcache simulate --replicas N --json`."""
        e = self.events
        return {
            "router": self.router,
            "num_replicas": self.num_replicas,
            "capacity_blocks": self.capacity_blocks,
            "policy": self.policy,
            "block_tokens": self.block_tokens,
            "rate": self.rate,
            "prefill_ms_per_token": self.costs.prefill_ms_per_token,
            "decode_ms_per_token": self.costs.decode_ms_per_token,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "imbalance": self.imbalance,
            "utilisation": self.utilisation,
            "ttft_mean_s": self.ttft.mean_s,
            "ttft_p50_s": self.ttft.p50_s,
            "ttft_p99_s": self.ttft.p99_s,
            "ttft_max_s": self.ttft.max_s,
            "replicas": [r.as_dict() for r in self.replicas],
            "events": {
                "batches": e.batches,
                "events": e.events,
                "simulated_s": e.simulated_s,
                "events_per_s": e.events_per_s,
                "batches_per_s": e.batches_per_s,
                "peak_index_pages": e.peak_index_pages,
                "index_memory_bytes": e.index_memory_bytes,
            },
            "seconds": self.seconds,
        }
