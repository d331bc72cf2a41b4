"""Leases: a finished request's pages kept in the tree for `retain_for` seconds (`generate(..., retain_for=30)`).

An agent calls the model, runs a tool for a few seconds, then sends the same context plus the tool's output. A lease
keeps the first request's pages (prompt and reply, as the tree adopted them) locked for that pause, so LRU cannot
evict exactly the context that is about to come back. Unlike a pin (kv.pins), a lease ends on its own: nothing
leaks when the agent dies.

The rules (the KV manager owns one `LeaseTable` and calls it; every call runs on the engine loop thread):
- `grant` locks the path that ends the request's adopted pages (`RadixCache.lock_prefix`) until `now + seconds` on
  the table's clock (the engine's `lease_clock`, `time.monotonic` by default; tests inject one). Leases ending on
  that path above it whose deadlines come no later are released: the new lock holds their pages too.
- `renew` (a hit): a request whose match reaches the end of a lease (its match's path contains the leased path)
  moves that lease's deadline to `now + seconds` again, and makes it the youngest.
- `expire` releases every lease whose deadline has passed. The manager calls it before anything can evict (each
  admission and each decode's next page), and the engine before reading its gauges; so a lease nobody renews has
  its pages evictable at the first eviction after its deadline.
- The budget: leases together lock at most `max_blocks` pages (a page under two leases counts once). Past it the
  oldest lease gives way (is released) first; a lease longer than the whole budget keeps its first `max_blocks`
  pages. What was granted is the request's `LeaseGrant` (seconds and tokens; zero when nothing was held).
- Live work comes first: when an admission or a decode's next page cannot be found, the manager releases the oldest
  lease (`give_way`) and tries again, so a lease never fails or stalls a request.
- Restart, preemption, cancel and failure: leases live in memory only and only a request that finished takes one.

- A clock that fails (raises, or gives no finite number: the engine's `lease_clock` is the caller's code) fails no
  request: the table logs one warning naming the error until the clock works again; meanwhile nothing expires and
  nothing is renewed (the leases still give way to live work and to the budget), and a request that asked for a
  lease gets none (NO_LEASE). The clock is read before anything is locked, so no lock is left behind.

Invariants: every lease holds exactly one lock (`cache.lock` via `lock_prefix`) on its node, released exactly once;
`_leases` is ordered oldest first (grant or last renewal); `_next` is at most the earliest deadline.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from radixcache import RadixCache, TreeNode

log = logging.getLogger("radixcache.engine")

MAX_RETAIN_FOR_S = 86_400.0  # one day: longer is a pin (`pin=`, released by `unpin`), not a lease


def check_retain_for(value: object, where: str = "retain_for") -> float | None:
    """A lease request's seconds, checked: None, or a finite number in [0, MAX_RETAIN_FOR_S] (0: no lease). A bool,
    a string, NaN, an infinity, a negative or a larger number is a ValueError naming `where`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} must be a number of seconds or None, got {value!r}")
    if not math.isfinite(value) or not 0 <= value <= MAX_RETAIN_FOR_S:
        raise ValueError(f"{where} must be a finite number of seconds in [0, {MAX_RETAIN_FOR_S:g}], got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """What a request's lease got: `seconds` it runs from the request's end (renewed by hits), `tokens` it holds
    (whole pages of the prompt and reply; fewer than asked when past the budget). Both 0: nothing was held."""

    seconds: float
    tokens: int

    @property
    def granted(self) -> bool:
        return self.tokens > 0


NO_LEASE = LeaseGrant(0.0, 0)


@dataclass(slots=True)
class _Lease:
    node: TreeNode  # locked once by this lease; a split keeps the object at the same end
    seconds: float
    deadline: float
    tokens: int


class LeaseTable:
    """The leases of one cache, keyed by the uid of the node that ends them (see the module's rules)."""

    def __init__(self, cache: RadixCache, max_blocks: int, clock: Callable[[], float] | None = None) -> None:
        self.cache = cache
        self.max_blocks = max_blocks
        self.clock = clock or time.monotonic
        self._leases: dict[int, _Lease] = {}  # oldest first
        self._next = math.inf  # no deadline before this one
        self.granted = 0  # leases granted (tokens > 0)
        self.renewed = 0  # renewals by a hit
        self.expired = 0  # released at their deadline
        self.given_way = 0  # released early: past the budget, or for live work
        self._clock_failed = False  # the clock's last reading failed (warned once per run of failures)

    def __len__(self) -> int:
        return len(self._leases)

    @property
    def blocks(self) -> int:
        """Pages locked by leases (a page under two leases counts once)."""
        return self._union(self._leases.values())

    def deadlines(self) -> list[float]:
        """Every lease's deadline on the table's clock, oldest lease first."""
        return [lease.deadline for lease in self._leases.values()]

    # ------------------------------------------------------------------ the calls

    def expire(self) -> int:
        """Release every lease whose deadline has passed. Returns how many."""
        if not self._leases:
            return 0
        now = self._now()
        if now is None or now < self._next:
            return 0
        gone = [uid for uid, lease in self._leases.items() if lease.deadline <= now]
        for uid in gone:
            self._release(uid)
        self.expired += len(gone)
        self._next = min((lease.deadline for lease in self._leases.values()), default=math.inf)
        return len(gone)

    def grant(self, tokens: Sequence[int], namespace: Hashable, seconds: float) -> LeaseGrant:
        """Lease the first `len(tokens)` tokens (whole pages, already in the tree) for `seconds`."""
        p = self.cache.page_size
        n = min(len(tokens) // p, self.max_blocks) * p
        if seconds <= 0 or n <= 0:
            return NO_LEASE
        self.expire()
        now = self._now()  # before anything is locked: a clock that fails leaves no lock behind
        if now is None:
            return NO_LEASE
        node = self.cache.lock_prefix(tokens, n, namespace=namespace)
        if node is None:
            return NO_LEASE
        deadline = now + seconds
        old = self._leases.pop(node.uid, None)
        if old is not None:  # one lease per node: the new one's time (renewals), never an earlier deadline
            self.cache.unlock(old.node)
            deadline = max(deadline, old.deadline)
        mine = _Lease(node, seconds, deadline, n)
        self._leases[node.uid] = mine
        self._drop_covered(mine)
        while self.blocks > self.max_blocks and next(iter(self._leases)) != node.uid:
            self._give_way_oldest()
        self._next = min(self._next, deadline)
        self.granted += 1
        return LeaseGrant(seconds, n)

    def renew(self, node: TreeNode | None) -> int:
        """A request matched up to `node`: renew every lease that ends on its path. Returns how many."""
        if not self._leases or node is None:
            return 0
        now = self._now()
        if now is None:
            return 0
        renewed = 0
        n: TreeNode | None = node
        while n is not None and n.parent is not None:
            lease = self._leases.pop(n.uid, None)
            if lease is not None:
                if lease.deadline > now:
                    lease.deadline = now + lease.seconds
                    renewed += 1
                self._leases[n.uid] = lease  # the youngest now (an expired one is released at the next expire)
            n = n.parent
        self.renewed += renewed
        return renewed

    def give_way(self) -> bool:
        """Release the oldest lease (live work needs its pages). False when there is none."""
        if not self._leases:
            return False
        self._give_way_oldest()
        return True

    def clear(self) -> int:
        """Release every lease. Returns how many there were."""
        n = len(self._leases)
        for uid in list(self._leases):
            self._release(uid)
        self._next = math.inf
        return n

    # ------------------------------------------------------------------ private

    def _now(self) -> float | None:
        """The clock's reading, or None (one warning per run of failures) when it raises or gives no finite number:
        a fault of the caller's clock fails no request (module docstring)."""
        try:
            now = self.clock()
            if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
                raise ValueError(f"it returned {now!r}, not a finite number of seconds")
        except Exception as exc:
            if not self._clock_failed:
                log.warning("lease_clock failed (%r): leases neither expire, renew nor start until it works", exc)
            self._clock_failed = True
            return None
        self._clock_failed = False
        return float(now)

    def _drop_covered(self, mine: _Lease) -> None:
        """Release the leases that end above `mine` on its path and expire no later: its lock holds their pages."""
        n = mine.node.parent
        while n is not None and n.parent is not None:
            lease = self._leases.get(n.uid)
            if lease is not None and lease.deadline <= mine.deadline:
                self._release(n.uid)
            n = n.parent

    def _give_way_oldest(self) -> None:
        self._release(next(iter(self._leases)))
        self.given_way += 1

    def _release(self, uid: int) -> None:
        self.cache.unlock(self._leases.pop(uid).node)

    @staticmethod
    def _union(leases: object) -> int:
        seen: set[int] = set()
        total = 0
        for lease in leases:  # type: ignore[attr-defined]
            n: TreeNode | None = lease.node
            while n is not None and n.parent is not None and n.uid not in seen:
                seen.add(n.uid)
                total += len(n.blocks)
                n = n.parent
        return total
