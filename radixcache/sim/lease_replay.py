"""Replay with leases (`LeaseReplay`): a request's pages are held for its lease hint after it ends.

On the trace clock (`honor_timestamps` is forced on; times in ms). A request with a hint of `retain_for` seconds
takes, when it finishes, a lease on its pages (prompt and reply, as the tree adopted them: a lock on that path)
until `end + retain_for`, where `end` is when the request ended: its recorded finish time (a recorded trace's
`finish_timestamp`), else its arrival (a trace without durations, as the agent-session generator's, whose next step
arrives `retain_for` after it). The lease is the pause after the request, as the engine's starts when the request
ends: not the later arrival of the request whose admission makes it finish in the replay's in-flight model
(radixcache.sim.inflight), which only orders the tree's inserts. A lease whose deadline passed before then is
counted granted and expired, and holds nothing. While the lease runs its pages cannot be evicted. A later
request of the same session renews it at its arrival, as the engine's match does: the deadline moves to that arrival
plus the lease's own seconds, and the lease becomes the youngest; when that request ends, its own lease replaces
the session's previous one. Leases expire on their
own: before each arrival, every lease whose deadline has passed is released, so the pages are evictable at the
next eviction. The leased pages (counted per lease) may not exceed `budget` times the capacity: past it, the
oldest leases give way (are released) first. Without hints (a chat or Mooncake trace) it is a plain CacheReplay.

A policy with `expect_reuse_in` (radixcache.policy.lease) is told each request's hint before its match and its
insert, and None before a lease is released, so the pages a release frees (those no other lock holds) are keyed as
hint-less.

TTFT model: `ttft_ms = prefill_ms_per_token * (prompt tokens not hit)` (no queueing), the per-token cost of the
routing simulator's default costs; `ttft_p99_ms` is over all requests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from radixcache.errors import RadixCacheError
from radixcache.policy.base import EvictionPolicy
from radixcache.sim.cache_replay import CacheReplay
from radixcache.sim.replay_common import Replayable
from radixcache.sim.routing_results import RoutingCosts
from radixcache.trace.generator_args import MAX_RETAIN_FOR_S
from radixcache.trace.workload import SimRequest


def _check_hint(index: int, hint: object) -> float | None:
    """Request `index`'s lease hint: None, or seconds in [0, MAX_RETAIN_FOR_S] (what a trace's readers take).
    Anything else is a RadixCacheError before the request changes anything: a NaN deadline never expired and a
    negative one was granted and expired at once, whatever the policy."""
    if hint is None:
        return None
    if isinstance(hint, bool) or not isinstance(hint, (int, float)) or not 0 <= hint <= MAX_RETAIN_FOR_S:
        raise RadixCacheError(
            f"request {index}: a lease hint is None or seconds in [0, {MAX_RETAIN_FOR_S:g}], got {hint!r}"
        )
    return hint


class LeaseReplay(CacheReplay):
    """A CacheReplay that holds each request's pages for its lease hint (`hints[i]` seconds, None for none; past the
    end of `hints`, the request's own `retain_for`, as a recorded trace gives it)."""

    def __init__(
        self,
        workload: Replayable,
        capacity_blocks: int,
        policy: str | EvictionPolicy = "lru",
        hints: Sequence[float | None] = (),
        *,
        budget: float = 0.5,
        concurrency: int = 1,
        check: bool = False,
    ) -> None:
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 <= budget <= 1:
            # A string (from a config) or None was a TypeError from the comparison, and True a budget of 1.
            raise RadixCacheError(f"lease budget must be a fraction of capacity in [0, 1], got {budget!r}")
        super().__init__(workload, capacity_blocks, policy, concurrency=concurrency, check=check, honor_timestamps=True)
        self.hints = hints
        self.budget_pages = int(budget * capacity_blocks)
        self.hint = getattr(self.cache.policy, "expect_reuse_in", None)
        # key -> (deadline ms, locked node, pages, seconds), oldest grant (or renewal) first
        self.leases: dict[object, tuple[float, object, int, float]] = {}
        self.leased_pages = 0
        self.granted = self.given_way = self.expired = self.renewed = 0
        self.prefill_ms = RoutingCosts().prefill_ms_per_token
        self.ttfts: list[float] = []
        # id(in-flight tokens) -> (lease key, hint, when the request ended: ms on the trace clock)
        self._pending: dict[int, tuple[object, float | None, float]] = {}
        self._now = 0.0
        self._next: tuple[object, float | None, float] = (None, None, 0.0)
        add = self.inflight.add

        def add_noting_lease(item: tuple, finish_ms: float | None) -> None:
            self._pending[id(item[1])] = self._next
            add(item, finish_ms)

        self.inflight.add = add_noting_lease  # type: ignore[method-assign]

    def feed(self, index: int, request: SimRequest) -> None:
        self._now = request.timestamp_ms
        self._release(lambda deadline: deadline <= request.timestamp_ms, expired=True)
        hint = _check_hint(index, self.hints[index] if index < len(self.hints) else request.retain_for)
        if self.hint is not None:
            self.hint(hint)
        before = self.hit_blocks
        key = request.session if request.session is not None else ("request", index)
        self._renew(key)
        self._next = (key, hint, request.timestamp_ms if request.finish_ms is None else request.finish_ms)
        super().feed(index, request)
        hit = min((self.hit_blocks - before) * self.cache.page_size * request.unit, request.prompt_tokens)
        self.ttfts.append((request.prompt_tokens - hit) * self.prefill_ms)

    def _complete(self, item: tuple) -> None:
        try:
            self._finish(item)
        finally:
            if self.hint is not None:  # the arriving request's own hint again, for its match and insert
                self.hint(self._next[1])

    def _finish(self, item: tuple) -> None:
        """`item` finishes (a request before the one arriving): its insert under its own hint, then its lease."""
        key, hint, end = self._pending.pop(id(item[1]), (None, None, 0.0))
        if key is not None and hint is not None and key in self.leases:
            # Renewal: the session's new lease replaces its previous one, released first, so that the pages this
            # request read and wrote keep its hint, not the None the release tells (nothing evicts in between).
            self._drop(key)
        if self.hint is not None:
            self.hint(hint)
        super()._complete(item)
        if key is None or hint is None or hint <= 0:  # no lease for 0 s, as the engine's grant (it held a page)
            return
        full, namespace, p = item[1], item[3], self.cache.page_size
        # A lease longer than the whole budget keeps its first pages, as the engine's lease table does (it was not
        # granted at all: agents whose contexts outgrew the budget never held one, where the engine's would).
        pages = min(len(full) // p, self.budget_pages)
        if pages == 0:
            return
        deadline = end + hint * 1000.0
        if deadline <= self._now:  # it ran out before this arrival, the first instant anything could evict
            self.granted += 1
            self.expired += 1
            return
        held = self.cache.lock_prefix(full, pages * p, namespace=namespace)
        if held is None:
            return
        self.leases[key] = (deadline, held, pages, hint)
        self.leased_pages += pages
        self.granted += 1
        if key == self._next[0]:  # the request whose arrival finished this one is the session's next: a hit
            self._renew(key)
        # Past the budget the oldest lease (by grant or last renewal: `leases` keeps that order, a renewal being
        # dropped and added again) gives way, as the engine's lease table does; not the earliest deadline, which
        # would release a short lease granted just now before an old long one.
        while self.leased_pages > self.budget_pages:
            self._drop(next(iter(self.leases)))
            self.given_way += 1

    def _renew(self, key: object) -> None:
        """The session `key`'s context is back (its next request arrives): as the engine's match does, its lease's
        deadline moves to now plus the lease's own seconds, and it becomes the youngest."""
        lease = self.leases.pop(key, None)
        if lease is not None:
            self.leases[key] = (self._now + lease[3] * 1000.0, *lease[1:])
            self.renewed += 1

    def _release(self, due: Callable[[float], bool], *, expired: bool) -> None:
        for key in [k for k, (deadline, _, _, _) in self.leases.items() if due(deadline)]:
            self._drop(key)
            self.expired += expired

    def _drop(self, key: object) -> None:
        _, node, pages, _ = self.leases.pop(key)
        self.leased_pages -= pages
        if self.hint is not None:
            self.hint(None)
        self.cache.unlock(node)

    def close(self) -> None:
        super().close()
        self._release(lambda deadline: True, expired=False)

    def ttft_p99_ms(self) -> float:
        """The 99th percentile of the modelled TTFT (nearest rank), 0 with no requests."""
        if not self.ttfts:
            return 0.0
        ordered = sorted(self.ttfts)
        return ordered[min(len(ordered) - 1, max(0, -(-99 * len(ordered) // 100) - 1))]
