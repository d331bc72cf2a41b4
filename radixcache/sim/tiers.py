"""Host and disk tiers in the simulator: the cost model, the tiers' page keys, the modelled TTFT and the results.

The replay itself is `radixcache.sim.tiered_replay.TieredReplay`; this module holds what it is configured with
(`TierConfig`, `TierCosts`) and what it reports (`TierResult`, `TtftSummary`).

Cost model (no queueing): a request's modelled TTFT is

    prefill_s_per_token * (prompt tokens not hit in any tier)
    + host_load_s_per_page * (pages loaded from the host) + disk_load_s_per_page * (pages loaded from the disk)

Per-page load costs are given for pages of COST_PAGE_TOKENS (16) tokens and scale linearly with the tokens a page
holds (a page of 64 tokens costs 4 times as much; a Mooncake hash block of 512 tokens, 32 times). A tier's pages are
loaded only when loading is cheaper than recomputing them (`TierCosts.loads`); otherwise they are recomputed and
count as misses.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, fields

from radixcache.cache import RadixCache
from radixcache.errors import RadixCacheError
from radixcache.node import TreeNode
from radixcache.tier.page_tier import PageTier, TierStats
from radixcache.tier.tiered_cache import WRITE_POLICIES, TieredCache

COST_PAGE_TOKENS = 16  # the page size the per-page load costs are given for
#: the dearest cost (ms a token or a page) the models take: 11.6 days, no machine's, and it keeps every modelled time
#: of a trace finite (1e308 ms a token made a TTFT of inf, Infinity in --json and every replica's load equal)
MAX_COST_MS = 1e9
TIERS = ("device", "host", "disk")


@dataclass(frozen=True, slots=True)
class TierCosts:
    """The cost model's constants: prefill per token, and a page load from each tier per page of COST_PAGE_TOKENS.

    The defaults are THE defaults (of the CLI flags too): SmolLM2-135M on this project's 2-core CPU, measured by
    scripts/bench_tiers.py (a 600-token prefill; 64-page copies; warm disk reads, checksum included) and listed in
    docs/simulator.md and docs/tiers.md.
    """

    prefill_ms_per_token: float = 2.74
    host_load_ms_per_page: float = 0.56
    disk_load_ms_per_page: float = 1.87

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_COST_MS:
                raise RadixCacheError(f"{f.name} must be a number in [0, {MAX_COST_MS:g}] ms, got {value!r}")

    @property
    def prefill_s_per_token(self) -> float:
        return self.prefill_ms_per_token / 1000

    def load_s_per_page(self, tier: str, page_tokens: int) -> float:
        """Seconds to load one page of `page_tokens` tokens from `tier` ("host" or "disk"), scaled linearly."""
        ms = self.host_load_ms_per_page if tier == "host" else self.disk_load_ms_per_page
        return ms / 1000 * page_tokens / COST_PAGE_TOKENS

    def loads(self, tier: str, page_tokens: int) -> bool:
        """Whether a page found in `tier` is loaded: loading it is cheaper than recomputing its tokens."""
        return self.load_s_per_page(tier, page_tokens) < page_tokens * self.prefill_s_per_token


DEFAULT_TIER_COSTS = TierCosts()


@dataclass(frozen=True, slots=True)
class TierConfig:
    """The tiers under the device cache: a host tier and a disk tier (each optional, in blocks of the device's
    size), the host's write policy (radixcache.tier), and the cost model. Every page the device tree adopts is
    written through to the disk; the disk is the tier under the host, or directly under the device without one."""

    host_capacity_blocks: int | None = None
    disk_capacity_blocks: int | None = None
    write_policy: str = "write_through"
    costs: TierCosts = DEFAULT_TIER_COSTS

    def __post_init__(self) -> None:
        for name in ("host_capacity_blocks", "disk_capacity_blocks"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise RadixCacheError(f"{name} must be a positive int or None, got {value!r}")
        if self.write_policy not in WRITE_POLICIES:
            raise RadixCacheError(f"write_policy must be one of {', '.join(WRITE_POLICIES)}; got {self.write_policy!r}")
        if self.write_policy != "write_through" and self.host_capacity_blocks is None:  # as the CLI refuses it
            raise RadixCacheError(f"write_policy {self.write_policy!r} is the host tier's: needs host_capacity_blocks")
        if not isinstance(self.costs, TierCosts):
            raise RadixCacheError(f"costs must be a TierCosts, got {type(self.costs).__name__}")

    @property
    def tiers(self) -> tuple[str, ...]:
        """The tiers present, top down ("device" always)."""
        return (
            ("device",)
            + ("host",) * (self.host_capacity_blocks is not None)
            + ("disk",) * (self.disk_capacity_blocks is not None)
        )


@dataclass(frozen=True, slots=True)
class TtftSummary:
    """Modelled TTFT over a replay's requests, in seconds. Percentiles are nearest-rank (the value at rank
    ceil(q * n) in sorted order); see LatencyDigest for their precision past EXACT requests."""

    requests: int
    mean_s: float
    p50_s: float
    p99_s: float
    max_s: float

    def as_dict(self) -> dict:
        return {"ttft_mean_s": self.mean_s, "ttft_p50_s": self.p50_s, "ttft_p99_s": self.p99_s}


class LatencyDigest:
    """Mean, percentiles and max of a stream of non-negative values, in memory that does not grow with the stream.

    The first EXACT values are kept (8 bytes each), so percentiles are exact up to EXACT requests. Past that, they
    move into a histogram of log buckets, each RATIO (0.1%) wider than the one below, from LOW (1 ns) to HIGH
    (1e6 s), plus one bucket for zero: about 34,600 counters (277 KB). A percentile then is its bucket's geometric
    middle, clamped to the smallest and largest value seen: within 0.05% of the exact nearest-rank value (values
    below LOW count as LOW). The mean and max are exact.
    """

    EXACT = 1 << 16
    LOW = 1e-9
    HIGH = 1e6
    RATIO = 1.001

    __slots__ = ("count", "high", "hist", "low", "total", "values", "zeros")

    def __init__(self) -> None:
        self.values: array | None = array("d")
        self.hist: array | None = None
        self.count = self.zeros = 0
        self.total = 0.0
        self.low, self.high = math.inf, 0.0

    _LOG_RATIO = math.log(RATIO)
    _BUCKETS = int(math.log(HIGH / LOW) / math.log(RATIO)) + 1

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        if value < self.low:
            self.low = value
        if value > self.high:
            self.high = value
        values = self.values
        if values is not None:
            values.append(value)
            if len(values) > self.EXACT:
                self.values = None
                self.hist = array("q", bytes(8 * self._BUCKETS))
                for v in values:
                    self._bin(v)
            return
        self._bin(value)

    def _bin(self, value: float) -> None:
        if value <= 0:
            self.zeros += 1
            return
        assert self.hist is not None
        index = int(math.log(max(value, self.LOW) / self.LOW) / self._LOG_RATIO)
        self.hist[min(index, self._BUCKETS - 1)] += 1

    def percentile(self, q: float) -> float:
        """The nearest-rank q-quantile (0 < q <= 1); 0.0 for no values."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(q * self.count - 1e-9))
        if self.values is not None:
            return sorted(self.values)[rank - 1]
        if rank <= self.zeros:
            return 0.0
        assert self.hist is not None
        seen = self.zeros
        for index, n in enumerate(self.hist):
            seen += n
            if seen >= rank:
                middle = self.LOW * self.RATIO ** (index + 0.5)
                return min(max(middle, self.low), self.high)
        return self.high

    def summary(self) -> TtftSummary:
        if not self.count:
            return TtftSummary(0, 0.0, 0.0, 0.0, 0.0)
        return TtftSummary(self.count, self.total / self.count, self.percentile(0.5), self.percentile(0.99), self.high)


@dataclass(frozen=True, slots=True)
class TierResult:
    """What a tiered replay adds to its SimResult: where the hit tokens came from, the tiers' counters, and the
    modelled TTFT of this replay, of the device alone (the same device hits, no tiers) and with no cache at all.

    `hit_tokens[tier]`: prompt tokens served from that tier (device: matched in the tree; host, disk: loaded);
    they sum to the SimResult's hit_tokens. `loaded_blocks[tier]`: pages loaded from the host or the disk.
    `page_tokens`: real tokens per page, which scales the per-page load costs."""

    write_policy: str
    host_capacity_blocks: int | None
    disk_capacity_blocks: int | None
    costs: TierCosts
    page_tokens: int
    prompt_tokens: int
    hit_tokens: dict[str, int]
    loaded_blocks: dict[str, int]
    tier_stats: dict[str, TierStats]
    ttft: TtftSummary
    ttft_device_only: TtftSummary
    ttft_no_cache: TtftSummary
    key: str  # the tiers' page keys: "hash-id" (a hash trace's chained ids) or "blake2b" (radixcache.page_hash)

    @property
    def tier_hit_rate(self) -> dict[str, float]:
        """Tokens served from each tier over prompt tokens (the tiers present only); they sum to the hit rate."""
        n = self.prompt_tokens
        return {tier: (hits / n if n else 0.0) for tier, hits in self.hit_tokens.items()}

    def as_dict(self) -> dict:
        """The keys `radixcache simulate --json` adds for a tiered replay."""
        c = self.costs
        out = {
            "tier_hit_rate": self.tier_hit_rate,
            "tier_hit_tokens": dict(self.hit_tokens),
            "tier_loaded_blocks": dict(self.loaded_blocks),
            "write_policy": self.write_policy,
            "host_capacity_blocks": self.host_capacity_blocks,
            "disk_capacity_blocks": self.disk_capacity_blocks,
            "tiers": {
                name: {"capacity_blocks": s.capacity, "stored": s.stored, "evicted": s.evicted, "blocks": s.pages}
                for name, s in self.tier_stats.items()
            },
            **self.ttft.as_dict(),
            "costs": {
                "prefill_ms_per_token": c.prefill_ms_per_token,
                "host_load_ms_per_page": c.host_load_ms_per_page,
                "disk_load_ms_per_page": c.disk_load_ms_per_page,
                "cost_page_tokens": COST_PAGE_TOKENS,
                "page_tokens": self.page_tokens,
            },
            "device_only": {"hit_rate": self.tier_hit_rate["device"], **self.ttft_device_only.as_dict()},
            "no_cache": {"hit_rate": 0.0, **self.ttft_no_cache.as_dict()},
        }
        return out


# ---------------------------------------------------------------------------------------------- the tiers' keys


class _IdChain:
    """PageChain's `upto` for a hash trace: a page's key is its hash id (with the namespace, when there is one).
    Mooncake ids are chained, so an id already names its whole prefix."""

    __slots__ = ("namespace",)

    def __init__(self, namespace: Hashable) -> None:
        self.namespace = namespace

    def upto(self, tokens: Sequence[int], pages: int) -> list:
        ids = tokens[:pages]
        ids = ids.tolist() if isinstance(ids, array) else list(ids)
        if self.namespace is None:
            return ids
        return [(self.namespace, i) for i in ids]


class SimTieredCache(TieredCache):
    """A TieredCache whose page keys are either radixcache.page_hash's chained blake2b hashes (`key="blake2b"`, any
    trace) or, for a hash trace (page size 1 over chained hash ids), the ids themselves (`key="hash-id"`: no
    hashing at all)."""

    def __init__(self, device: RadixCache, *, key: str = "blake2b", **kwargs) -> None:
        if key not in ("blake2b", "hash-id"):
            raise RadixCacheError(f"key must be 'blake2b' or 'hash-id', got {key!r}")
        if key == "hash-id" and device.page_size != 1:
            raise RadixCacheError("hash-id keys need a cache of page size 1 over hash ids")
        super().__init__(device, **kwargs)
        self.key = key

    def chain(self, namespace: Hashable):  # type: ignore[override]
        if self.key == "hash-id":
            return _IdChain(namespace)
        return super().chain(namespace)

    def _node_hashes(self, node: TreeNode) -> list:
        if self.key == "hash-id":
            ids = node.key.tolist()
            return ids if node.namespace is None else [(node.namespace, i) for i in ids]
        return super()._node_hashes(node)


def build_tiers(
    device: RadixCache, config: TierConfig, key: str
) -> tuple[SimTieredCache, PageTier | None, PageTier | None]:
    """The tiered cache over `device` for `config`: (tiered, host, disk). The disk, when there is one, is the lower
    tier, and every page the device adopts is stored in it (write-through)."""
    host = PageTier(config.host_capacity_blocks, name="host") if config.host_capacity_blocks is not None else None
    disk = PageTier(config.disk_capacity_blocks, name="disk") if config.disk_capacity_blocks is not None else None
    write_lower = None
    if disk is not None:
        store = disk.store

        def write_lower(hashes: list, blocks: list[int], tokens: Sequence[int]) -> None:
            for h in reversed(hashes):  # tail first: its head the newest, as the engine's index has a run once written
                store(h)

    tiered = SimTieredCache(
        device, key=key, host=host, lower=disk, write_policy=config.write_policy, write_lower=write_lower
    )
    return tiered, host, disk
