"""Replay a workload through N simulated engine replicas behind a router (radixcache.router), without a model.

Each replica is a `RadixCache` of `capacity_blocks` and a single FIFO server. A request arrives (at its trace
timestamp, or at `rate` requests/s), the router picks a replica from the `LoadTracker` and the `RouterIndex` as
they are at that instant, and the request waits in that replica's queue. At service start its prompt is matched
in the replica's cache and locked, and blocks are allocated for the rest (evicting by the replica's policy); it
then takes

    service = prefill_s_per_token * (prompt tokens not hit at service start) + decode_s_per_token * output tokens

and its modelled TTFT is its queueing delay plus its prefill. When the prefill ends its prompt's full pages enter
the tree (as the runtime commits pages per pass); when it finishes, its output's pages follow and its match is
unlocked. One request is in service per replica at a time (no batching: the decode cost per token is one
request's share of a batched step). `speeds` (one factor per replica, 1 by default) divides a replica's service
times: 0.5 is a replica at half speed (one on a busy core). The router is not told them: it sees only its queues.

Each replica publishes its cache's changes to the router's index exactly as an engine would: the page keys the
tree adopts on insert (`stored`) and those that leave it on eviction (`removed`, through `RadixCache.on_evict`), in
numbered `EventBatch`es applied at once (no lag). Page keys are a hash trace's ids (with the namespace, when
there is one) or radixcache.page_hash's chained hashes of a token trace's pages. A key two tree positions share
(a hash trace whose ids are not chained) is published when the first copy enters and the last one leaves.
A request's session is its trace's `session` scoped by its `namespace`, as the cluster scopes it: two tenants'
`chat-1` are two sessions.

Memory does not grow with the number of requests: the trace is streamed, the TTFT percentiles use a
`LatencyDigest`, and only requests in flight (queued or running) are held.
"""

from __future__ import annotations

import copy
import heapq
import math
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from itertools import count

from radixcache.errors import RadixCacheError
from radixcache.page_hash import PageChain, chain_hashes, namespace_key, root_hash
from radixcache.policy.base import EvictionPolicy
from radixcache.policy.registry import make_policy
from radixcache.router import (
    EventBatch,
    LoadTracker,
    Router,
    RouteRequest,
    RouterIndex,
    make_router,
)
from radixcache.sim.replay_common import check_flags, check_progress, check_workload, fit_request, request_tokens
from radixcache.sim.routing_replicas import Job, Replica
from radixcache.sim.routing_results import DEFAULT_ROUTING_COSTS, EventStats, ReplicaResult, RoutingCosts, RoutingResult
from radixcache.sim.routing_workload import RoutedWorkload, arrival_times, routed_requests
from radixcache.sim.source import TraceSource
from radixcache.sim.tiers import LatencyDigest
from radixcache.trace.workload import SimRequest, Workload

_FINGERPRINT = "radixcache-routing-sim"  # the page-hash root of a token trace's pages (no model: any fixed string)
#: the most replicas a replay simulates: each holds a tree and a queue, all made up front (10**9 ran out of memory)
MAX_SIM_REPLICAS = 4096


class RoutingReplay:
    """A routing replay, built once and `run` over one stream of requests. `record`: keep every request's
    (rid, replica, hit tokens, TTFT) in `records` (for tests: memory grows with the trace). `check`: after every
    event, the index must equal each replica's cached pages recomputed from its tree (slow: for tests)."""

    def __init__(
        self,
        replicas: int,
        capacity_blocks: int,
        router: str | Router = "cache_aware",
        *,
        page_size: int = 1,
        block_tokens: int = 1,
        kind: str = "token",
        policy: str | EvictionPolicy = "lru",
        costs: RoutingCosts = DEFAULT_ROUTING_COSTS,
        seed: int = 0,
        record: bool = False,
        check: bool = False,
        speeds: Sequence[float] | None = None,
    ) -> None:
        if type(replicas) is not int or not 1 <= replicas <= MAX_SIM_REPLICAS:
            raise RadixCacheError(f"replicas must be an int in [1, {MAX_SIM_REPLICAS:,}], got {replicas!r}")
        if type(capacity_blocks) is not int or capacity_blocks < 1:
            raise RadixCacheError(f"capacity_blocks must be a positive int, got {capacity_blocks!r}")
        if not isinstance(costs, RoutingCosts):
            raise RadixCacheError(f"costs must be a RoutingCosts, got {type(costs).__name__}")
        if type(seed) is not int:  # it seeds the arrivals and power_of_two: True or "7" seeded them silently
            raise RadixCacheError(f"seed must be an int, got {seed!r}")
        if isinstance(router, str):
            router = make_router(router, seed=seed) if router == "power_of_two" else make_router(router)
        if not isinstance(router, Router):  # else an AttributeError ('route') at the first request
            raise RadixCacheError(f"router must be a name in ROUTERS or a Router, got {type(router).__name__}")
        self.router = router
        self.speeds = check_speeds(speeds, replicas)
        self.capacity_blocks, self.policy = capacity_blocks, make_policy(policy).name
        self.page_size, self.block_tokens, self.kind = page_size, block_tokens, kind
        self.costs = costs
        self.prefill_s = costs.prefill_ms_per_token / 1000
        self.decode_s = costs.decode_ms_per_token / 1000
        self.index = RouterIndex()
        self.loads = LoadTracker(self.prefill_s, self.decode_s)
        # A policy object is copied for each replica: one shared by every replica's tree learned from all of them
        # (cost's inflation, reuse's classes, keyed by each tree's own clock), and none gave a replica's figures alone.
        self.replicas = [
            Replica(r, capacity_blocks, page_size, policy if isinstance(policy, str) else copy.deepcopy(policy))
            for r in range(replicas)
        ]
        for r in range(replicas):
            self.index.add_replica(r)
        self.ids = tuple(range(replicas))
        self.ttft = LatencyDigest()
        self.record, self.check = record, check
        self.records: list[tuple[int, int, int, float]] = []
        self._heap: list[tuple] = []
        self._order = count()
        self._roots: dict[Hashable, bytes] = {}
        self.batches = self.events = self.pages = self.peak_pages = 0
        self.rate: float | None = None  # what the result reports: the arrival rate, None for timestamps
        self.first_arrival: float | None = None
        self.last_event = 0.0
        self.seconds = 0.0

    # ------------------------------------------------------------------ the replay

    def run(self, arrivals: Iterable[tuple[float, SimRequest, int]], progress: Callable[[int], None] | None = None):
        """Replay `arrivals` ((arrival s, request, output tokens), in arrival order), then drain every queue."""
        started = time.perf_counter()
        n = -1
        for n, (t, request, out) in enumerate(arrivals):
            if self.first_arrival is None:
                self.first_arrival = t
            self._advance(t)
            self._arrive(n, t, request, out)
            if self.check:
                self.check_index()
            if progress is not None and n % 256 == 255:
                progress(256)
        self._advance(math.inf)
        if progress is not None and (n + 1) % 256:
            progress((n + 1) % 256)
        self.seconds += time.perf_counter() - started
        return self.result()

    def _advance(self, now: float) -> None:
        """Process every prefill end and finish up to `now` (before an arrival at the same instant)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            t, _, kind, replica, job = heapq.heappop(heap)
            self.last_event = t
            if kind == 0:
                self._prefilled(replica, job)
            else:
                self._finished(replica, job, t)
            if self.check:
                self.check_index()

    def _arrive(self, rid: int, t: float, request: SimRequest, out: int) -> None:
        keys, chain = self._page_keys(request)
        session = request.session
        if session is not None and request.namespace is not None:  # a tenant's "chat-1" is its own, as the cluster's
            session = f"{namespace_key(request.namespace)}|{session}"
        route = RouteRequest(keys, request.prompt_tokens, out, self.page_size * request.unit, session)
        r, matched = self.router.route(route, self.ids, self.index, self.loads)
        replica = self.replicas[r]
        self.loads.dispatched(r, rid, route.uncached_tokens(matched), out)
        replica.queue.append(Job(rid, t, request, out, keys, chain))
        if not replica.busy:
            self._start(replica, t)

    def _start(self, replica: Replica, now: float) -> None:
        """Serve the next request of `replica`'s queue from `now`: match, lock, allocate, schedule its prefill end
        and its finish."""
        job = replica.queue.popleft()
        replica.busy = True
        cache, p, request = replica.cache, self.page_size, job.request
        full, prompt = request_tokens(request)
        match = cache.match_prefix(prompt, namespace=request.namespace)
        cache.lock(match.node)
        matched_pages = len(match.blocks)
        full, need, _, _ = fit_request(cache, full, matched_pages)
        new = cache.allocate(need)
        self._publish(replica, [])
        job.node, job.full, job.blocks = match.node, full, match.blocks + new
        job.prompt_pages = min(len(request.prompt) // p, len(full) // p)
        tokens = request.prompt_tokens
        hit = min(match.length * request.unit, tokens)
        self.loads.started(replica.id, job.rid, tokens - hit)
        speed = self.speeds[replica.id]
        prefill = (tokens - hit) * self.prefill_s / speed
        service = prefill + job.out * self.decode_s / speed
        ttft = now - job.arrival + prefill
        self.ttft.add(ttft)
        replica.requests += 1
        replica.prompt_tokens += tokens
        replica.hit_tokens += hit
        replica.ttft_s += ttft
        replica.busy_s += service
        if self.record:
            self.records.append((job.rid, replica.id, hit, ttft))
        heapq.heappush(self._heap, (now + prefill, next(self._order), 0, replica, job))
        heapq.heappush(self._heap, (now + service, next(self._order), 1, replica, job))

    def _prefilled(self, replica: Replica, job: Job) -> None:
        """The prompt is computed: its full pages enter the tree (still locked by the match below them)."""
        self.loads.prefill_done(replica.id, job.rid)
        pages = job.prompt_pages
        if pages:
            self._insert(replica, job, pages)

    def _finished(self, replica: Replica, job: Job, now: float) -> None:
        """The output is generated: its full pages enter the tree, the match is unlocked, the next request starts."""
        p = self.page_size
        self._insert(replica, job, len(job.full) // p)
        cache = replica.cache
        if len(job.full) % p:
            cache.free(job.blocks[-1:])  # the unaligned tail page never enters the tree
        cache.unlock(job.node)
        self.loads.finished(replica.id, job.rid)
        replica.busy = False
        if replica.queue:
            self._start(replica, now)

    def _insert(self, replica: Replica, job: Job, pages: int) -> None:
        p = self.page_size
        cached = replica.cache.insert(job.full[: pages * p], job.blocks[:pages], namespace=job.request.namespace) // p
        if pages > cached:
            keys = self._keys_upto(job, pages)
            self._publish(replica, replica.adopted(keys[cached:pages], job.blocks[cached:pages]))

    def _publish(self, replica: Replica, stored: list) -> None:
        """One batch of what `replica`'s cache changed (the evictions since the last batch, and `stored`),
        applied to the index at once."""
        removed = replica.removed
        if not stored and not removed:
            return
        replica.seq += 1
        batch = EventBatch(replica.id, replica.seq, tuple(stored), tuple(removed))
        replica.removed = []
        applied = self.index.apply(batch)
        assert applied, "the simulator publishes batches in order"
        self.batches += 1
        self.events += batch.events
        self.pages += len(stored) - len(removed)
        self.peak_pages = max(self.peak_pages, self.pages)

    # ------------------------------------------------------------------ page keys

    def _page_keys(self, request: SimRequest) -> tuple[list, PageChain | None]:
        """The prompt's page keys as the router sees them, and the chain that extends them (token traces)."""
        if self.kind == "hash":
            return _hash_keys(request.prompt, request.namespace), None
        root = self._roots.get(request.namespace)
        if root is None:
            root = self._roots[request.namespace] = root_hash(_FINGERPRINT, request.namespace)
        chain = PageChain(root, self.page_size)
        return chain.upto(request.prompt, len(request.prompt) // self.page_size), chain

    def _keys_upto(self, job: Job, pages: int) -> list:
        if job.chain is None:  # a hash request: a page is an id, of its prompt, then of its recorded output
            return job.keys[:pages] if pages <= len(job.keys) else _hash_keys(job.full[:pages], job.request.namespace)
        return job.chain.upto(job.full, pages)  # type: ignore[attr-defined]

    def tree_keys(self, replica: int) -> set:
        """The page keys of every page in `replica`'s tree, recomputed from the tree's token paths (not from what
        was published): what the index must hold."""
        cache = self.replicas[replica].cache
        out: set = set()
        for node in cache.iter_nodes():
            tokens = node.tokens()
            first = node.prefix_len // self.page_size
            if self.kind == "hash":
                ids = tokens[first:]
                out.update(ids if node.namespace is None else [(node.namespace, i) for i in ids])
            else:
                root = root_hash(_FINGERPRINT, node.namespace)
                out.update(chain_hashes(tokens, self.page_size, root)[first:])
        return out

    def check_index(self) -> None:
        """Raise AssertionError unless the index holds exactly each replica's cached pages."""
        for r in self.ids:
            assert self.index.keys(r) == self.tree_keys(r), f"replica {r}: the index differs from the tree"

    # ------------------------------------------------------------------ results

    def result(self) -> RoutingResult:
        replicas = tuple(
            ReplicaResult(
                rep.id,
                rep.requests,
                rep.prompt_tokens,
                rep.hit_tokens,
                rep.busy_s,
                rep.ttft_s / rep.requests if rep.requests else 0.0,
                rep.cache.stats.evicted_blocks,
                self.index.pages(rep.id),
            )
            for rep in self.replicas
        )
        span = self.last_event - self.first_arrival if self.first_arrival is not None else 0.0
        events = EventStats(self.batches, self.events, span, self.peak_pages, self.index.memory_bytes())
        return RoutingResult(
            router=self.router.name,
            num_replicas=len(self.replicas),
            capacity_blocks=self.capacity_blocks,
            policy=self.policy,
            block_tokens=self.block_tokens,
            costs=self.costs,
            rate=self.rate,
            requests=sum(r.requests for r in replicas),
            prompt_tokens=sum(r.prompt_tokens for r in replicas),
            hit_tokens=sum(r.hit_tokens for r in replicas),
            ttft=self.ttft.summary(),
            replicas=replicas,
            events=events,
            seconds=self.seconds,
        )


def _hash_keys(ids: Iterable[int], namespace: Hashable) -> list:
    """A hash request's page keys: its ids, with the namespace when there is one."""
    keys = list(ids)
    return keys if namespace is None else [(namespace, i) for i in keys]


def simulate_routing(
    workload: Workload | TraceSource | RoutedWorkload,
    replicas: int,
    capacity_blocks: int,
    router: str | Router = "cache_aware",
    *,
    policy: str | EvictionPolicy = "lru",
    costs: RoutingCosts = DEFAULT_ROUTING_COSTS,
    rate: float | None = None,
    arrivals: str = "poisson",
    seed: int = 0,
    router_params: Mapping[str, object] | None = None,
    progress: Callable[[int], None] | None = None,
    check: bool = False,
    speeds: Sequence[float] | None = None,
) -> RoutingResult:
    """Replay `workload` (an in-memory Workload or RoutedWorkload, or a streamed TraceSource) through `replicas`
    replicas of `capacity_blocks` blocks each, behind `router` (a name from radixcache.router.ROUTERS, with
    `router_params`, or a Router). Arrivals at the trace's timestamps, or at `rate` requests/s (`arrivals`
    "poisson", seeded with `seed`, or "even"). `seed` also seeds power_of_two. `policy`: each replica's eviction
    policy, a name or an EvictionPolicy (copied for each replica, whose tree owns its copy). `check`: the index is
    checked against every replica's tree after every event (slow: for tests). `speeds`: each replica's speed factor
    (RoutingReplay)."""
    check_flags(check=check)
    check_progress(progress)
    check_workload(workload)
    if router_params is not None and not isinstance(router_params, Mapping):
        raise RadixCacheError(f"router_params must be a mapping of the router's parameters, got {router_params!r:.40}")
    if isinstance(router, str) and router_params:
        router = make_router(router, **router_params)
    replay = RoutingReplay(
        replicas,
        capacity_blocks,
        router,
        page_size=workload.page_size,
        block_tokens=workload.block_tokens,
        kind=workload.kind,
        policy=policy,
        costs=costs,
        seed=seed,
        check=check,
        speeds=speeds,
    )
    replay.rate = rate
    return replay.run(arrival_times(routed_requests(workload), rate, arrivals, seed), progress)


def check_speeds(speeds: Sequence[float] | None, replicas: int) -> tuple[float, ...]:
    """Each replica's speed factor: `speeds` checked (one finite number > 0 per replica), or 1 for each."""
    if speeds is None:
        return (1.0,) * replicas
    if not isinstance(speeds, Sequence) or len(speeds) != replicas:
        raise RadixCacheError(f"speeds must be a sequence of {replicas} numbers, one per replica, got {speeds!r:.60}")
    for v in speeds:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise RadixCacheError(f"speeds must be finite numbers > 0, got {v!r}")
    return tuple(float(v) for v in speeds)
