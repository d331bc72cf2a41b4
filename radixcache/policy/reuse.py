"""`reuse`: an eviction policy that learns, online, which kinds of cached spans are read again, and how soon.

Every insert makes one leaf; the leaf and every node later split from it share its `created` clock, so the policy
keeps one small record per insert (a *group*). A group's class is what was known when it was made:
- the size of the insert (log2 pages), and whether it hung from the root (a request that hit nothing);
- a bucket of the request's output length, when the caller gave it through `expect` (the simulator gives a
  trace's output_length; the engine gives the tokens a request generated for the pages it inserts as the request
  finishes, while pages committed as the request runs, before its length is known, get -1): in chat and document
  traffic a long answer often means a one-off request. The engine commits a prompt a prefill pass at a time and
  each page a decode fills, each a group of its own; the simulator does so with `prefill_chunk`
  (`simulate --prefill-chunk 512`, which a recording's printed command adds), else it inserts a recorded prompt
  whole at its start, one group, and its hit rate is then 3.4 points off the engine's on the sample;
- with `ghosts=N`, whether it *returns*: its first page, at the same depth, was evicted before (the last N such
  keys), so this content has been asked for at least twice. Off by default: on the study's traces it moved hit
  rates by under half a point either way, and cost a tenth more time per request.
A leaf's class is its group's class plus its hit count (0, 1, 2, 3+).

Per class the policy keeps decayed counts of *reuses* and of *waiting time*: a reuse is a prefix match that ends
in one of the group's nodes (the cache reports it through `on_hit`, since the policy sets `observes_hits`), and the
waiting time is how long the group sat unread before that match, or before the eviction that ended its wait.
Their ratio is the class's reuse rate per unit of cache time, which a class cannot inflate merely by being kept
longer (the bias of counting "was it read before eviction"). A class with few outcomes is pulled towards the mean
by `prior` typical outcomes' worth of waiting.

The priority is LRU with a head start: `last_access + weight * horizon * clip(log(rate * cost / mean rate))`,
where the horizon is the running mean of how long an evicted leaf had gone unaccessed, `cost` the recompute cost
of the leaf's tokens (attention grows with depth: `1 + depth / attention_scale`, GreedyDual's benefit), and the
weight is `credit` for a class above the mean and `penalty` below it. A key fixed at access time keeps eviction
at heap cost, like LRU; with no signal, or with every class alike, the policy *is* LRU; the clip bounds what a
wrong estimate can cost. The defaults were chosen on the sweep in docs/eviction.md and checked on held-out seeds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from radixcache.errors import PolicyError
from radixcache.policy.base import EvictionPolicy, check_parameter

if TYPE_CHECKING:
    from radixcache.node import TreeNode

_REFRESH = 64
_NOTHING = (0.0, 0.0)
_MAX_GROUPS = 1 << 17  # the oldest groups' records go first past this; their nodes then fall back to live features


class ReusePolicy(EvictionPolicy):
    """Learned reuse rate per class, as a bounded head start over LRU (see the module docstring)."""

    name = "reuse"
    observes_hits = True
    keys_drift = True

    def __init__(
        self,
        credit: float = 0.3,
        penalty: float | None = 0.5,
        clip: float = 3.0,
        prior: float = 1.0,
        decay: float = 0.9999,
        initial_horizon: float = 200.0,
        attention_scale: float = 4096.0,
        ghosts: int = 0,
    ) -> None:
        for name, value in (("credit", credit), ("penalty", credit if penalty is None else penalty), ("clip", clip)):
            check_parameter(f"reuse: {name}", value, 0)
        for name, value in (
            ("prior", prior),
            ("initial_horizon", initial_horizon),
            ("attention_scale", attention_scale),
        ):
            check_parameter(f"reuse: {name}", value, 0, above=True)
        check_parameter("reuse: decay", decay, 0, above=True, high=1)
        if type(ghosts) is not int or ghosts < 0:  # -1 turned them off silently, "8" failed at the first access
            raise PolicyError(f"reuse: ghosts must be an int >= 0, got {ghosts!r}")
        self.credit, self.clip, self.prior, self.decay = credit, clip, prior, decay
        self.penalty = credit if penalty is None else penalty
        self.attention_scale = attention_scale
        self._shallow = attention_scale / 128
        self.horizon = float(initial_horizon)  # running mean of how long an evicted leaf had gone unaccessed (ticks)
        self.now = 0  # the latest access time seen: the cache's clock, near enough
        # class -> [decayed count of reuses, decayed ticks spent waiting (each wait ended by a reuse or an eviction)]
        self._stats: dict[tuple, list[float]] = {}
        self._classes: dict[tuple, tuple] = {}  # a group's class without hits -> its four classes by hit count
        self._all_reuses = self._all_waits = self._all_outcomes = 0.0
        self._groups: dict[int, list] = {}  # created clock -> its record (`_new_group`)
        self._expected: int = -1  # the output bucket the next insert's group takes (`expect`), -1 when unknown
        # Class credits are recomputed after every `_REFRESH` outcomes, not at every ranking: ranking is the hot
        # path (once per leaf access), and one outcome barely moves a rate.
        self._credits: dict[tuple, float] = {}
        self.ghosts = ghosts
        # evicted leaves' first pages (hashed with namespace and depth), oldest first; only with `ghosts` > 0
        self._ghosts: dict[int, None] = {}
        self._outcomes = 0

    # ------------------------------------------------------------------ what callers tell it

    def expect(self, output_tokens: int | None) -> None:
        """The next insert is a request that produced `output_tokens` tokens (None: unknown). Raises PolicyError for
        anything but None or an int >= 0: int() raised ValueError for NaN, and a negative count took the bucket of
        its absolute value (the admission's `class_of` reads the same count, and raised AttributeError for a float)."""
        if output_tokens is not None and (type(output_tokens) is not int or output_tokens < 0):
            raise PolicyError(f"reuse: output_tokens must be an int >= 0 or None, got {output_tokens!r}")
        self._expected = -1 if output_tokens is None else min(output_tokens.bit_length(), 12)

    # ------------------------------------------------------------------ the policy protocol

    def priority(self, node: TreeNode) -> tuple:
        last = node.last_access
        if last > self.now:
            self.now = last
        group = self._groups.get(node.created) or self._new_group(node)
        hits = node.hit_count
        klass = group[0][hits if hits < 3 else 3]
        x = self._credits.get(klass)
        if x is None:
            x = self._class_credit(klass)
        if x is None:  # nothing learned yet: LRU
            return (last,)
        depth = node.prefix_len + len(node.key) / 2
        if depth > self._shallow:  # the recompute cost; under 1% of a unit for a shallow leaf, so left out there
            x += math.log1p(depth / self.attention_scale)
        if x > 0:
            return (last + self.credit * self.horizon * (x if x < self.clip else self.clip),)
        return (last + self.penalty * self.horizon * (x if x > -self.clip else -self.clip),)

    def _class_credit(self, klass: tuple) -> float | None:
        """log(rate / mean rate) of a class, cached until the next refresh; None while nothing is learned."""
        mean = self.mean_rate()
        if mean <= 0.0:
            return None
        x = self._credits[klass] = math.log(max(self.rate(klass), 1e-300) / mean)
        return x

    def on_hit(self, node: TreeNode) -> None:
        """A prefix match ended in `node` (its hit count already counts it): one reuse of its group's class."""
        group = self._groups.get(node.created)
        if group is None:
            return
        clock = node.last_access
        if clock > self.now:
            self.now = clock
        hits = node.hit_count - 1
        waited = clock - group[1] if clock > group[1] else 0
        group[1] = clock
        self._record(group[0][hits if hits < 3 else 3], 1.0, waited)

    def on_evict(self, node: TreeNode, priority: tuple) -> None:
        now = self.now
        group = self._groups.get(node.created)
        if group is not None:
            hits = node.hit_count
            waited = now - group[1] if now > group[1] else 0
            self._record(group[0][hits if hits < 3 else 3], 0.0, waited)
            group[1] = now  # the rest of the group waits afresh: its time is not counted twice
            if group[2] is not None:  # the group's content is (partly) gone: remembered once, as a ghost
                ghosts = self._ghosts
                ghosts[group[2]] = None
                group[2] = None
                if len(ghosts) > self.ghosts:
                    del ghosts[next(iter(ghosts))]
        idle = now - node.last_access
        self.horizon += 0.01 * ((idle if idle > 0 else 0) - self.horizon)

    # ------------------------------------------------------------------ learning

    def rate(self, klass: tuple) -> float:
        """Reuses per tick of waiting for a class, shrunk towards the mean while it has little time observed."""
        mean = self._all_reuses / self._all_waits if self._all_waits > 0 else 0.0
        weight = self.prior_weight()
        reuses, waits = self._stats.get(klass, _NOTHING)
        return (reuses + weight * mean) / (waits + weight)

    def prior_weight(self) -> float:
        """Ticks of waiting worth `prior` typical outcomes: how far an unseen class is pulled to the mean."""
        return self.prior * self._all_waits / self._all_outcomes if self._all_outcomes > 0 else 0.0

    def observed(self, klass: tuple) -> float:
        """Decayed ticks of waiting observed for a class: how much evidence its rate rests on."""
        return self._stats.get(klass, _NOTHING)[1]

    def mean_rate(self) -> float:
        return self._all_reuses / self._all_waits if self._all_waits > 0 else 0.0

    def _record(self, klass: tuple, reuse: float, waited: float) -> None:
        self._outcomes += 1
        if self._outcomes % _REFRESH == 0:
            self._credits.clear()
        d = self.decay
        stats = self._stats.get(klass)
        if stats is None:
            stats = self._stats[klass] = [0.0, 0.0]
        stats[0] = stats[0] * d + reuse
        stats[1] = stats[1] * d + waited
        self._all_reuses = self._all_reuses * d + reuse
        self._all_waits = self._all_waits * d + waited
        self._all_outcomes = self._all_outcomes * d + 1.0

    @staticmethod
    def class_of(
        pages: int, *, root: bool, hits: int, output_tokens: int | None = None, returning: bool = False
    ) -> tuple:
        """The class of a leaf made by inserting `pages` pages (hanging from the root or not) for a request that
        generated `output_tokens`, hit `hits` times (the admission policy asks about the class to come)."""
        out = -1 if output_tokens is None else min(output_tokens.bit_length(), 12)
        return (pages.bit_length(), root, out, returning, min(hits, 3))

    def _new_group(self, node: TreeNode) -> list:
        """The record of the insert that made `node`: [its classes by hit count, when its wait began, its ghost key
        (None once remembered)]. Kept only for a leaf just inserted; any other unknown node gets a transient one."""
        fresh = node.created == node.last_access and node.hit_count == 0
        ghost = _first_page(node) if fresh and self.ghosts > 0 else None
        returning = ghost is not None and ghost in self._ghosts
        base = (len(node.blocks).bit_length(), node.prefix_len == 0, self._expected if fresh else -1, returning)
        classes = self._classes.get(base)
        if classes is None:  # one tuple per class and hit count, shared by every group of that class
            classes = self._classes[base] = ((*base, 0), (*base, 1), (*base, 2), (*base, 3))
        group = [classes, node.last_access, ghost]
        if fresh:
            self._expected = -1
            if len(self._groups) >= _MAX_GROUPS:
                del self._groups[next(iter(self._groups))]
            self._groups[node.created] = group
        return group


def _first_page(node: TreeNode) -> int:
    """A leaf's identity that outlives it: its namespace, depth and first page, hashed."""
    key = node.key
    page = len(key) // len(node.blocks)
    return hash((node.namespace, node.prefix_len, key[0] if page == 1 else key[:page].tobytes()))


def tell_output_length(policy: object, output_tokens: int | None) -> None:
    """Tell `policy` what the request about to insert generated, if it learns from output lengths (`ReusePolicy`,
    found through wrappers' `base`, as the runtime's retention wrapper); other policies are left alone."""
    while policy is not None and not hasattr(policy, "expect"):
        policy = getattr(policy, "base", None)
    if policy is not None:
        policy.expect(output_tokens)  # type: ignore[attr-defined]
