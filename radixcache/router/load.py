"""What the router knows about a request and about each replica's load, in tokens.

Load is measured in tokens of work, not in requests: a replica running one 30,000-token prefill is busier than
one running ten short chats. `LoadTracker.work(r)` turns a replica's pending tokens into seconds of work with two
relative costs (a prefill token, a decode token), so prefill and decode weigh what they cost.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from radixcache.router.errors import RouterError
from radixcache.router.events import PageKey

# The defaults are the simulator's (radixcache.sim.routing_results): seconds per token on this project's 2-core CPU
# with SmolLM2-135M. Prefill: radixcache.sim.tiers.DEFAULT_TIER_COSTS (scripts/bench_tiers.py, 2.74 ms a
# token). Decode: the Engine's batch-8 aggregate decode, about 162 tokens/s (docs/benchmarks.md), so 6.2 ms a token
# of one request's share of a batched step. Only their ratio matters to the routers.
DEFAULT_PREFILL_COST = 2.74e-3
DEFAULT_DECODE_COST = 6.2e-3


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """A request as the router sees it.

    page_keys: the chained hashes of the prompt's pages, in order (only a prefix of them may be cached anywhere).
    prompt_tokens, max_tokens: real tokens in the prompt and to generate. page_size: real tokens per page, so
    `matched_pages * page_size` is the prompt served from a cache. session: a conversation id, or None. rid: the id
    the caller will dispatch it with (`LoadTracker.dispatched`), or None: routers that remember requests in flight
    (radixcache.router.inflight) drop exactly this one's record once the tracker no longer holds it.
    """

    page_keys: Sequence[PageKey]
    prompt_tokens: int
    max_tokens: int
    page_size: int
    session: str | None = None
    rid: Hashable = None

    def __post_init__(self) -> None:
        if not isinstance(self.page_keys, Sequence):  # an iterator: the first replica scored would consume it
            object.__setattr__(self, "page_keys", tuple(self.page_keys))
        for name, low in (("prompt_tokens", 0), ("max_tokens", 0), ("page_size", 1)):
            value = getattr(self, name)
            if type(value) is not int or value < low:
                raise RouterError(f"RouteRequest.{name} must be an int >= {low}, got {value!r}")
        if self.session is not None and not isinstance(self.session, str):  # routers hash it, and key dicts by it
            raise RouterError(f"RouteRequest.session must be a str or None, got {type(self.session).__name__}")

    def uncached_tokens(self, matched_pages: int) -> int:
        """Prompt tokens left to prefill when `matched_pages` pages are cached."""
        return max(0, self.prompt_tokens - matched_pages * self.page_size)


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One replica's work in flight: prefill tokens not yet computed, decode tokens not yet generated, and the
    requests dispatched to it and not finished (queued or running)."""

    pending_prefill_tokens: float
    pending_decode_tokens: float
    running: int


class LoadTracker:
    """Per-replica load, updated by whoever dispatches requests (the front door, or the simulator).

    A request is `dispatched` with the prefill tokens it is expected to compute (its prompt less the pages the
    index says the replica holds) and the tokens it will decode; `prefill_done` moves it past its prefill;
    `finished` removes it. Invariants: each replica's totals are the sums over its requests in flight (clamped at
    zero against float rounding, and exactly zero when none is in flight); a request id is in flight at most
    once. `work(r) = pending_prefill_tokens * prefill_cost + pending_decode_tokens * decode_cost` (seconds, or any
    unit, as long as both costs are in it).
    """

    __slots__ = ("_decode", "_prefill", "_requests", "_running", "decode_cost", "prefill_cost")

    def __init__(self, prefill_cost: float = DEFAULT_PREFILL_COST, decode_cost: float = DEFAULT_DECODE_COST) -> None:
        for name, value in (("prefill_cost", prefill_cost), ("decode_cost", decode_cost)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise RouterError(f"{name} must be a finite number >= 0, got {value!r}")
        self.prefill_cost = float(prefill_cost)
        self.decode_cost = float(decode_cost)
        self._prefill: dict[int, float] = {}
        self._decode: dict[int, float] = {}
        self._running: dict[int, int] = {}
        # rid -> [replica, prefill tokens still pending (0 once done), decode tokens, prefill done]: a flag, not the
        # count, says done, since a request the router expected to hit in full is dispatched with 0 prefill tokens
        self._requests: dict[Hashable, list] = {}

    def dispatched(self, replica: int, rid: Hashable, prefill_tokens: float, decode_tokens: float) -> None:
        """`rid` was sent to `replica`. Raises RouterError if `rid` is in flight already or a count is negative or
        not finite."""
        if rid in self._requests:
            raise RouterError(f"request {rid!r} is in flight already")
        _check_tokens("prefill_tokens", prefill_tokens)
        _check_tokens("decode_tokens", decode_tokens)
        self._requests[rid] = [replica, prefill_tokens, decode_tokens, False]
        self._prefill[replica] = self._prefill.get(replica, 0.0) + prefill_tokens
        self._decode[replica] = self._decode.get(replica, 0.0) + decode_tokens
        self._running[replica] = self._running.get(replica, 0) + 1

    def started(self, replica: int, rid: Hashable, prefill_tokens: float) -> bool:
        """`rid` began on `replica`, which now knows the prefill it must compute (its prompt less what its cache
        actually hit): the estimate given at dispatch is replaced. False if it is not in flight or its prefill is
        done. Optional: without it the dispatch estimate stands until `prefill_done`."""
        entry = self._entry(replica, rid)
        if entry is None or entry[3]:
            return False
        _check_tokens("prefill_tokens", prefill_tokens)
        self._prefill[replica] = max(0.0, self._prefill[replica] - entry[1] + prefill_tokens)
        entry[1] = prefill_tokens
        return True

    def prefill_done(self, replica: int, rid: Hashable) -> bool:
        """`rid`'s prefill is computed: its prefill tokens leave the replica's load. False if it is not in flight
        (or its prefill was done already)."""
        entry = self._entry(replica, rid)
        if entry is None or entry[3]:
            return False
        self._prefill[replica] = max(0.0, self._prefill[replica] - entry[1])
        entry[1] = 0
        entry[3] = True
        return True

    def finished(self, replica: int, rid: Hashable) -> bool:
        """`rid` finished (or was aborted): all its tokens leave the replica's load. False if it is not in flight."""
        entry = self._entry(replica, rid)
        if entry is None:
            return False
        del self._requests[rid]
        running = self._running[replica] - 1
        self._running[replica] = running
        if running == 0:  # nothing in flight: exactly idle, whatever float rounding left
            self._prefill[replica] = self._decode[replica] = 0.0
        else:
            self._prefill[replica] = max(0.0, self._prefill[replica] - entry[1])
            self._decode[replica] = max(0.0, self._decode[replica] - entry[2])
        return True

    def remove_replica(self, replica: int) -> int:
        """Forget `replica` and its requests in flight (it died); returns how many were dropped."""
        dropped = [rid for rid, entry in self._requests.items() if entry[0] == replica]
        for rid in dropped:
            del self._requests[rid]
        self._prefill.pop(replica, None)
        self._decode.pop(replica, None)
        self._running.pop(replica, None)
        return len(dropped)

    def load(self, replica: int) -> ReplicaLoad:
        """`replica`'s load now (zero for a replica never dispatched to)."""
        return ReplicaLoad(
            self._prefill.get(replica, 0.0), self._decode.get(replica, 0.0), self._running.get(replica, 0)
        )

    def holds(self, replica: int, rid: Hashable) -> bool:
        """Whether `rid` is in flight on `replica`."""
        entry = self._requests.get(rid)
        return entry is not None and entry[0] == replica

    def running(self, replica: int) -> int:
        """Requests dispatched to `replica` and not finished."""
        return self._running.get(replica, 0)

    def work(self, replica: int) -> float:
        """`replica`'s pending work: prefill tokens times prefill_cost plus decode tokens times decode_cost."""
        return self._prefill.get(replica, 0.0) * self.prefill_cost + self._decode.get(replica, 0.0) * self.decode_cost

    def in_flight(self) -> int:
        """Requests in flight over all replicas."""
        return len(self._requests)

    def _entry(self, replica: int, rid: Hashable) -> list | None:
        entry = self._requests.get(rid)
        if entry is not None and entry[0] != replica:
            raise RouterError(f"request {rid!r} was dispatched to replica {entry[0]}, not {replica}")
        return entry


def _check_tokens(name: str, value: object) -> None:
    """A token count is a finite number >= 0 (a float, or an int a float holds): an infinite one would leave
    inf - inf = NaN, clamped to 0, in its replica's totals once it finished, erasing the other requests' load."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    try:
        ok = ok and math.isfinite(value) and value >= 0  # type: ignore[arg-type,operator]
    except OverflowError:  # an int past any float
        ok = False
    if not ok:
        raise RouterError(f"{name} must be a finite number >= 0, got {value!r}")
