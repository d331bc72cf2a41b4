"""Our policy: route each request to the replica that would give it the earliest first token, counting what a
recomputed prefix costs the rest of the cluster.

    expected_ttft(r) = work(r) + uncached_prefill(r)
                     = LoadTracker.work(r) + (prompt_tokens - matched_pages(r) * page_size) * prefill_cost

    score(r) = expected_ttft(r) + (miss_weight - 1) * uncached_prefill(r) + balance * (recent(r) - mean recent)

`work(r)` is the replica's queued work in tokens weighed by their cost. `matched_pages(r)` is what the replica will
hold when the request runs: the exact event-fed index's match, or, when longer, the match against the requests in
flight there (radixcache.router.inflight), whose pages will be cached by then. The least score wins.

- The TTFT term trades affinity against load continuously: a cached prefix is worth the prefill it saves, so a
  busy replica keeps its affinity until its queue costs more than the hit saves; no threshold switches affinity
  off, and a miss (nothing cached anywhere) goes to the least-loaded replica, never to the "smallest tree".
- `miss_weight` > 1 charges a recomputed prefill beyond the request's own wait: it also occupies a replica that
  later requests queue behind, and copies a prefix into a second cache, evicting something there. Tuned to 3.
- `recent(r)` is the work this router sent to r over its last ~`balance_horizon` requests per replica (decayed
  exponentially per routing call). `work(r)` sees only what is queued now, so at low load every replica looks
  idle and sessions that stick pile onto whichever replicas happened to take them; `balance` (seconds of score
  per second of excess recent work) places new work on the replicas that took less than their share. Tuned to 1.
  A replica with no recent work here (it joined, or came back after a death) starts at the others' mean.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

from radixcache.router.base import Route, Router, check_replicas
from radixcache.router.errors import RouterError
from radixcache.router.index import RouterIndex
from radixcache.router.inflight import InFlightPrefixes
from radixcache.router.load import LoadTracker, RouteRequest


class ReplicaScore(NamedTuple):
    """One replica's score for one request: the pages it would serve from its cache, the work queued there, the
    TTFT it would give, and the score the router minimises (TTFT plus the miss and balance terms)."""

    replica: int
    matched_pages: int
    work_s: float
    expected_ttft_s: float
    score: float


class CacheAwareRouter(Router):
    """The replica of least score (see the module); ties to the better match, then to the replica this router
    chose least recently (one never chosen first), then to the lower id. (Exact ties are idle replicas holding the
    same match: rotating among them spreads misses instead of always loading the lowest id.)

    Sessions stick: a request with a `session` goes back to the replica that served that session last, as long
    as its score exceeds the best by at most `session_slack * best expected TTFT + session_slack_s`. Stickiness
    keeps a conversation on the replica that holds its history when another one looks marginally better, which
    would otherwise copy the history into a second cache; the slack bounds what it may cost. The router remembers
    the last `max_sessions` sessions (least recently routed forgotten first), so its memory is bounded.

    `in_flight`: count the prefixes of requests routed to a replica and not finished as cached there (on by
    default; off, the router sees the index alone).

    Invariants: `choose` returns a member of `replicas`; the state kept (sessions, in-flight prefixes, recent work,
    last choice per replica) is bounded by `max_sessions`, the requests in flight and the number of replicas.
    """

    name = "cache_aware"

    def __init__(
        self,
        miss_weight: float = 3.0,
        balance: float = 1.0,
        balance_horizon: int = 64,
        session_slack: float = 0.25,
        session_slack_s: float = 0.5,
        max_sessions: int = 100_000,
        in_flight: bool = True,
    ) -> None:
        for name, value, low in (
            ("miss_weight", miss_weight, 1.0),
            ("balance", balance, 0.0),
            ("session_slack", session_slack, 0.0),
            ("session_slack_s", session_slack_s, 0.0),
        ):
            # finite: an infinite weight makes a score inf * 0 = NaN, and min() then picks any replica
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < math.inf:
                raise RouterError(f"cache_aware: {name} must be a finite number >= {low}, got {value!r}")
        for name, value, low in (("balance_horizon", balance_horizon, 1), ("max_sessions", max_sessions, 0)):
            if type(value) is not int or value < low:
                raise RouterError(f"cache_aware: {name} must be an int >= {low}, got {value!r}")
        if not isinstance(in_flight, bool):  # "no" is truthy: in-flight tracking on, silently
            raise RouterError(f"cache_aware: in_flight must be True or False, got {in_flight!r}")
        self.miss_weight = miss_weight
        self.balance = balance
        self.balance_horizon = balance_horizon
        self.session_slack = session_slack
        self.session_slack_s = session_slack_s
        self.max_sessions = max_sessions
        self.in_flight = InFlightPrefixes() if in_flight else None
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._recent: dict[int, float] = {}  # replica -> work routed there lately, decayed per call
        self._chosen: dict[int, int] = {}  # replica -> the call that last chose it
        self._calls = 0

    def scores(
        self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker
    ) -> list[ReplicaScore]:
        """Every replica's score, in the order of `replicas` (records nothing)."""
        out = []
        cost = loads.prefill_cost
        extra_miss = self.miss_weight - 1
        keys = request.page_keys
        pending = self.in_flight
        balance = self.balance
        recent = self._recent_of(replicas) if balance else {}
        mean = sum(recent.values()) / len(replicas) if balance else 0.0
        for r in replicas:
            matched = index.matched_pages(r, keys)
            if pending is not None:
                pending.sync(r, loads.running(r), partial(loads.holds, r))
                matched = max(matched, pending.matched_pages(r, keys))
            work = loads.work(r)
            prefill = request.uncached_tokens(matched) * cost
            ttft = work + prefill
            score = ttft + extra_miss * prefill + (balance * (recent[r] - mean) if balance else 0.0)
            out.append(ReplicaScore(r, matched, work, ttft, score))
        return out

    def choose(self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker) -> int:
        return self.route(request, replicas, index, loads).replica

    def route(self, request: RouteRequest, replicas: Sequence[int], index: RouterIndex, loads: LoadTracker) -> Route:
        check_replicas(replicas)
        scores = self.scores(request, replicas, index, loads)
        chosen_at = self._chosen
        best = min(scores, key=lambda s: (s.score, -s.matched_pages, chosen_at.get(s.replica, -1), s.replica))
        chosen = best
        session = request.session
        if session is not None and self.max_sessions:
            last = self._sessions.get(session)
            if last is not None and last != best.replica:
                mine = next((s for s in scores if s.replica == last), None)
                slack = self.session_slack * best.expected_ttft_s + self.session_slack_s
                if mine is not None and mine.score - best.score <= slack:
                    chosen = mine
            self._sessions[session] = chosen.replica
            self._sessions.move_to_end(session)
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        self._record(chosen, request, replicas, loads)
        return Route(chosen.replica, chosen.matched_pages)

    def _record(
        self, chosen: ReplicaScore, request: RouteRequest, candidates: Sequence[int], loads: LoadTracker
    ) -> None:
        """What the next calls need: when each replica was last chosen, the prefixes in flight, the recent work."""
        self._calls += 1
        self._chosen[chosen.replica] = self._calls
        if self.in_flight is not None:
            self.in_flight.add(chosen.replica, request.page_keys, request.rid)
        if self.balance:
            recent = self._recent
            recent.update(self._recent_of(candidates))  # a replica that just joined: its share, from now on
            decay = 1 - 1 / (self.balance_horizon * len(candidates))
            for r in recent:
                recent[r] *= decay
            added = (chosen.expected_ttft_s - chosen.work_s) + request.max_tokens * loads.decode_cost
            recent[chosen.replica] += added

    def _recent_of(self, replicas: Sequence[int]) -> dict[int, float]:
        """Each replica's recent work; one the router has none for (it joined, or came back after a death, since
        the others took work) counts as their mean: it took its share. At 0 it looked as if it had refused the
        others' whole history, and the balance term sent it every request it could, conversations whose histories
        an idle replica holds too (6 of the next 8 turns of 8 conversations, each recomputing its history)."""
        recent = self._recent
        known = [recent[r] for r in replicas if r in recent]
        share = sum(known) / len(known) if known else 0.0
        return {r: recent.get(r, share) for r in replicas}

    def forget(self, replica: int) -> None:
        """Drop what the router remembers of `replica` (it left the routing set)."""
        for session in [s for s, r in self._sessions.items() if r == replica]:
            del self._sessions[session]
        self._chosen.pop(replica, None)
        self._recent.pop(replica, None)
        if self.in_flight is not None:
            self.in_flight.forget(replica)

    def __repr__(self) -> str:
        return (
            f"CacheAwareRouter(miss_weight={self.miss_weight!r}, balance={self.balance!r}, "
            f"balance_horizon={self.balance_horizon!r}, session_slack={self.session_slack!r}, "
            f"session_slack_s={self.session_slack_s!r}, max_sessions={self.max_sessions!r}, "
            f"in_flight={self.in_flight is not None!r})"
        )
