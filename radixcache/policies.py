"""Eviction policies: each maps an evictable leaf to a sortable priority; the smallest is evicted first.

The cache keeps its evictable leaves in a heap ordered by `(policy.priority(node), node.uid)`. A priority is
computed when a leaf enters the set (it becomes a leaf, or is unlocked) and again whenever it is accessed. A
split or a partial eviction is not an access and keeps the priority, unless the policy sets `ranks_by_extent`.
Each cache owns its policy instance.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from radixcache.errors import PolicyError

if TYPE_CHECKING:
    from radixcache.node import TreeNode


class EvictionPolicy(ABC):
    """Strategy object for choosing which unlocked leaf to evict next."""

    name: str = "abstract"
    #: True when the cache must re-rank a leaf after a split or a partial eviction: its priority depends on
    #: which blocks it holds (Belady, dead-block LRU), or is re-derived from learned state at every ranking
    #: (reuse). Otherwise a leaf keeps the priority of its last access: a reshape is not an access.
    ranks_by_extent: bool = False

    @abstractmethod
    def priority(self, node: TreeNode) -> tuple:
        """Sort key of an evictable leaf: smaller is evicted sooner."""

    def on_evict(self, node: TreeNode, priority: tuple) -> None:  # noqa: B027 - optional hook
        """Called once per leaf as eviction takes blocks from it; stateful policies age themselves here."""


class LRUPolicy(EvictionPolicy):
    """Least recently used: the leaf accessed longest ago goes first."""

    name = "lru"

    def priority(self, node: TreeNode) -> tuple:
        return (node.last_access,)


class LFUPolicy(EvictionPolicy):
    """Least frequently used: fewest prefix hits first, ties broken by recency."""

    name = "lfu"

    def priority(self, node: TreeNode) -> tuple:
        return (node.hit_count, node.last_access)


class FIFOPolicy(EvictionPolicy):
    """First in, first out: the leaf inserted earliest goes first, however often it is hit."""

    name = "fifo"

    def priority(self, node: TreeNode) -> tuple:
        return (node.created, node.last_access)


class SLRUPolicy(EvictionPolicy):
    """Segmented LRU: leaves hit fewer than `protect_after` times (the probation segment) go before any
    protected leaf; LRU within each segment.

    In chat and agent workloads most one-off turns are hit at most once, while system prompts and shared
    tool definitions are hit again and again. SLRU keeps a burst of one-off requests from flushing those.
    Unlike textbook SLRU, the protected segment has no size cap: it is demoted only by running out of
    probation leaves.
    """

    name = "slru"

    def __init__(self, protect_after: int = 2) -> None:
        if protect_after < 1:
            raise PolicyError(f"slru: protect_after must be >= 1, got {protect_after}")
        self.protect_after = protect_after

    def priority(self, node: TreeNode) -> tuple:
        return (node.hit_count >= self.protect_after, node.last_access)


class CostAwarePolicy(EvictionPolicy):
    """GreedyDual-Size-Frequency over recompute cost: keeps leaves that are expensive to recompute and often hit.

    Recomputing a block costs MLP work plus attention over everything before it, so a block at depth d
    (tokens) costs about `1 + d / attention_scale`. A leaf's value is `inflation + (hits + 1) * cost`, where
    cost is the mean per-block cost over the leaf. Evicting a leaf raises `inflation` to its value, which ages
    every leaf that is not accessed again (GreedyDual's clock), so stale but deep prefixes still go eventually.
    """

    name = "cost"

    def __init__(self, attention_scale: float = 4096.0) -> None:
        if attention_scale <= 0:
            raise PolicyError(f"cost: attention_scale must be > 0, got {attention_scale}")
        self.attention_scale = attention_scale
        self.inflation = 0.0

    def priority(self, node: TreeNode) -> tuple:
        mid_depth = node.prefix_len + len(node.key) / 2
        cost = 1.0 + mid_depth / self.attention_scale
        return (self.inflation + (node.hit_count + 1) * cost, node.last_access)

    def on_evict(self, node: TreeNode, priority: tuple) -> None:
        self.inflation = max(self.inflation, priority[0])


class BeladyPolicy(EvictionPolicy):
    """Belady's offline optimum (MIN): evict the block whose next use is farthest; ties go to the deeper block.

    An offline bound for simulation, not a policy a server can run: `next_use(node)` is an oracle that says
    when the leaf's deepest block is next read (a request position, larger is later; a block read by no later
    request gets a number beyond every position). In a prefix tree a block is never read later than its
    descendants, so comparing leaves by their deepest block is comparing blocks. Not in `POLICIES`: it cannot
    be built without its oracle (see `radixcache.simulate_oracle`).
    """

    name = "belady"
    ranks_by_extent = True

    def __init__(self, next_use: Callable[[TreeNode], int]) -> None:
        self.next_use = next_use

    def priority(self, node: TreeNode) -> tuple:
        return (-self.next_use(node), -(node.prefix_len + len(node.key)))


class ReuseAwarePolicy(EvictionPolicy):
    """LRU with a learned credit per reuse class: classes that tend to be hit again are kept longer.

    A leaf's class is its hit count (0, 1, 2, 3+). The policy keeps, per class, a decayed count of how often a
    keyed leaf was hit again within `horizon_mult` horizons, the horizon being a running mean of how long
    evicted, uncredited leaves had gone unaccessed (how long LRU keeps a leaf; it starts at
    `initial_horizon` clock ticks). A leaf's priority is `last_access + k * horizon * x`, where x is its
    class's hit rate relative to the mean over all classes, shrunk towards the mean while the class has few
    outcomes and clamped to [-max_penalty, max_credit]. With no signal every x is 0 and the policy is LRU;
    a credit is a fixed head start on the clock, so stale credited leaves still go (GreedyDual's aging).

    The measure is partly self-reinforcing: a credited class lives longer, so more of its hits fall inside the
    window. At small capacities this acts like SLRU with aging (reused leaves outlive floods of one-off
    suffixes); at large ones evictions are few, so the class rates stay shrunk towards the mean, the horizon
    stays near its start, and it behaves close to LRU. The defaults were tuned on the sweep in
    docs/eviction.md, which reports where it helps and where it does not.
    """

    name = "reuse"
    ranks_by_extent = True

    def __init__(
        self,
        k: float = 2.0,
        horizon_mult: float = 2.0,
        max_credit: float = 0.75,
        max_penalty: float = 0.5,
        decay: float = 0.9995,
        prior: float = 4.0,
        initial_horizon: float = 200.0,
    ) -> None:
        if min(k, max_credit, max_penalty) < 0 or min(horizon_mult, prior, initial_horizon) <= 0 or not 0 < decay <= 1:
            raise PolicyError("reuse: need k, max_credit, max_penalty >= 0; horizon_mult, prior, initial_horizon > 0")
        self.k, self.horizon_mult, self.decay, self.prior = k, horizon_mult, decay, prior
        self.max_credit, self.max_penalty = max_credit, max_penalty
        self.horizon = float(initial_horizon)  # running mean of how long an uncredited leaf stays unaccessed (ticks)
        self._now = 0  # the latest access time seen: the cache's clock, near enough
        self._hits = [0.0, 0.0, 0.0, 0.0]  # per class: decayed count of hits within the window
        self._trials = [0.0, 0.0, 0.0, 0.0]  # per class: decayed count of outcomes (hit or not)
        self._all_hits = self._all_trials = 0.0  # the same over all classes
        self._seen: dict[int, tuple[int, int, int, float]] = {}  # uid -> (class, hits, last access, x) when keyed

    def priority(self, node: TreeNode) -> tuple:
        last = node.last_access
        if last > self._now:
            self._now = last
        seen = self._seen.get(node.uid)
        if seen is not None and node.hit_count > seen[1]:  # hit since it was keyed: one outcome for its class
            self._record(seen[0], last - seen[2] <= self.horizon_mult * self.horizon)
        klass = min(node.hit_count, 3)
        x = self._relative_rate(klass)
        self._seen[node.uid] = (klass, node.hit_count, last, x)
        return (last + self.k * self.horizon * x,)

    def on_evict(self, node: TreeNode, priority: tuple) -> None:
        seen = self._seen.pop(node.uid, None)
        if seen is not None:
            self._record(seen[0], False)
        if seen is None or seen[3] <= 0.0:
            # Only leaves that had no credit measure the horizon: a credited leaf is evicted late by design,
            # and letting it stretch the horizon would raise every credit again (a runaway loop).
            self.horizon += 0.01 * (self._now - node.last_access - self.horizon)

    def _record(self, klass: int, hit: bool) -> None:
        d = self.decay
        self._hits[klass] = self._hits[klass] * d + hit
        self._trials[klass] = self._trials[klass] * d + 1.0
        self._all_hits = self._all_hits * d + hit
        self._all_trials = self._all_trials * d + 1.0

    def _relative_rate(self, klass: int) -> float:
        """The class's hit rate relative to the mean, shrunk towards the mean while it has few outcomes."""
        if self._all_trials == 0.0:
            return 0.0
        mean = max(self._all_hits / self._all_trials, 1e-3)
        rate = (self._hits[klass] + self.prior * mean) / (self._trials[klass] + self.prior)
        return max(-self.max_penalty, min(self.max_credit, (rate - mean) / mean))


POLICIES: Mapping[str, type[EvictionPolicy]] = MappingProxyType(
    {cls.name: cls for cls in (LRUPolicy, LFUPolicy, FIFOPolicy, SLRUPolicy, CostAwarePolicy)}
)
#: this project's own policies, usable by name everywhere; kept out of POLICIES until tests/cache cover them
EXPERIMENTAL_POLICIES: Mapping[str, type[EvictionPolicy]] = MappingProxyType({ReuseAwarePolicy.name: ReuseAwarePolicy})
ALL_POLICIES: Mapping[str, type[EvictionPolicy]] = MappingProxyType({**POLICIES, **EXPERIMENTAL_POLICIES})


def make_policy(policy: str | EvictionPolicy) -> EvictionPolicy:
    """A fresh policy instance for a name in `ALL_POLICIES`, or the given instance itself."""
    if isinstance(policy, EvictionPolicy):
        return policy
    if isinstance(policy, str) and policy.lower() in ALL_POLICIES:
        return ALL_POLICIES[policy.lower()]()
    raise PolicyError(f"unknown eviction policy {policy!r}; choose one of {', '.join(sorted(ALL_POLICIES))}")
