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
request's share of a batched step).

Each replica publishes its cache's changes to the router's index exactly as an engine would: the page keys the
tree adopts on insert (`stored`) and those that leave it on eviction (`removed`, through `RadixCache.on_evict`), in
numbered `EventBatch`es applied at once (no lag). Page keys are a hash trace's ids (with the namespace, when
there is one) or radixcache.page_hash's chained hashes of a token trace's pages. A key two tree positions share
(a hash trace whose ids are not chained) is published when the first copy enters and the last one leaves.

Memory does not grow with the number of requests: the trace is streamed, the TTFT percentiles use a
`LatencyDigest`, and only requests in flight (queued or running) are held.
"""

from __future__ import annotations

import heapq
import math
import multiprocessing
import random
import time
from array import array
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields
from itertools import count
from pathlib import Path

from radixcache.blocks import block_ids
from radixcache.cache import RadixCache
from radixcache.errors import RadixCacheError
from radixcache.page_hash import PageChain, chain_hashes, root_hash
from radixcache.policy.registry import make_policy
from radixcache.router import (
    EventBatch,
    LoadTracker,
    Router,
    RouteRequest,
    RouterIndex,
    make_router,
)
from radixcache.sim.source import TraceSource, open_source
from radixcache.sim.tiers import DEFAULT_TIER_COSTS, LatencyDigest, TtftSummary
from radixcache.tokens import as_token_array
from radixcache.trace import FORMAT_KINDS, detect_format
from radixcache.trace.formats import iter_trace
from radixcache.trace.synthetic import GENERATORS
from radixcache.trace.workload import SimRequest, Workload, load_workload, token_workload

ARRIVALS = ("poisson", "even")
#: one request's share of a batched decode step on this project's CPU (the Engine's batch-8 aggregate, about 162
#: tokens/s in docs/benchmarks.md); radixcache.router's DEFAULT_DECODE_COST in milliseconds
DEFAULT_DECODE_MS_PER_TOKEN = 6.2
_FINGERPRINT = "radixcache-routing-sim"  # the page-hash root of a token trace's pages (no model: any fixed string)


@dataclass(frozen=True, slots=True)
class RoutingCosts:
    """The queueing model's service costs, in milliseconds per token (defaults: radixcache.router.load's)."""

    prefill_ms_per_token: float = DEFAULT_TIER_COSTS.prefill_ms_per_token
    decode_ms_per_token: float = DEFAULT_DECODE_MS_PER_TOKEN

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise RadixCacheError(f"{f.name} must be a finite number >= 0, got {value!r}")


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


#: a request with the real tokens it decodes
RoutedRequest = tuple[SimRequest, int]


@dataclass(frozen=True, slots=True)
class RoutedWorkload:
    """Requests with their output lengths, in memory and in arrival order (`routed_in_memory`): what a hash trace's
    in-memory Workload cannot carry (it keeps no output length)."""

    requests: tuple[RoutedRequest, ...]
    page_size: int
    block_tokens: int
    kind: str

    def __iter__(self) -> Iterator[RoutedRequest]:
        return iter(self.requests)


def routed_in_memory(source: TraceSource) -> RoutedWorkload:
    """A trace file read whole and sorted by timestamp (stable: ties keep file order), with output lengths."""
    page = source.page_size if source.kind == "token" else None
    workload = load_workload(source.path, source.format, page_size=page, block_size=source.block_tokens)
    raw = sorted(_raw_records(source), key=lambda record: record.timestamp_ms)  # the same stable sort
    outputs = (record.output_length for record in raw)
    requests = tuple(zip(workload.requests, outputs, strict=True))
    return RoutedWorkload(requests, source.page_size, source.block_tokens, source.kind)


def routed_requests(workload: Workload | TraceSource | Iterable[RoutedRequest]) -> Iterator[RoutedRequest]:
    """Each request of `workload` with its output length in real tokens, streamed.

    A trace file's output length is its records' `output_length` (a hash trace records no output ids, so the
    simulator's SimRequest does not carry it): the file is read again beside the TraceSource, which checks it.
    An in-memory Workload's is its recorded output (`len(output) * unit`). Anything else is taken as given.
    """
    if isinstance(workload, TraceSource):
        yield from _with_outputs(workload)
    elif isinstance(workload, Workload):
        for request in workload:
            yield request, len(request.output) * request.unit
    else:
        yield from workload


def _raw_records(source: TraceSource) -> Iterator:
    """The file's records (TokenRequest or HashRequest), which carry output_length."""
    return iter_trace(source.path, source.format, block_size=source.block_tokens if source.kind == "hash" else None)


def _with_outputs(source: TraceSource) -> Iterator[RoutedRequest]:
    """The source's requests, each with its record's output_length (the file read twice, side by side; the
    source checks each line and the arrival order first)."""
    for request, record in zip(source, _raw_records(source), strict=True):
        yield request, record.output_length


def arrival_times(
    requests: Iterable[RoutedRequest], rate: float | None = None, arrivals: str = "poisson", seed: int = 0
) -> Iterator[tuple[float, SimRequest, int]]:
    """(arrival in seconds, request, output tokens): the trace's timestamps (ms), or `rate` requests/s in the
    trace's order, as a Poisson process seeded with `seed` (the first arrival one gap after 0) or evenly spaced
    (the i-th at i / rate)."""
    if rate is None:
        for request, out in requests:
            yield request.timestamp_ms / 1000, request, out
        return
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        raise RadixCacheError(f"rate must be a finite number of requests/s > 0, got {rate!r}")
    if arrivals not in ARRIVALS:
        raise RadixCacheError(f"arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    rng = random.Random(seed)
    t = 0.0
    for i, (request, out) in enumerate(requests):
        t = t + rng.expovariate(rate) if arrivals == "poisson" else i / rate
        yield t, request, out


class _Job:
    """A request in flight on a replica."""

    __slots__ = ("arrival", "blocks", "chain", "full", "keys", "node", "out", "prompt_pages", "request", "rid")

    def __init__(self, rid: int, arrival: float, request: SimRequest, out: int, keys: list, chain: object) -> None:
        self.rid = rid
        self.arrival = arrival
        self.request = request
        self.out = out
        self.keys = keys  # the prompt's page keys, as routed
        self.chain = chain  # the page-key chain of a token request (PageChain), None for a hash request
        self.node = None
        self.full = None
        self.blocks: array = block_ids()
        self.prompt_pages = 0


class _Replica:
    """One simulated engine: its cache, its FIFO queue, what it published, and its counters."""

    __slots__ = (
        "busy",
        "busy_s",
        "cache",
        "held",
        "hit_tokens",
        "id",
        "key_of_block",
        "prompt_tokens",
        "queue",
        "removed",
        "requests",
        "seq",
        "ttft_s",
    )

    def __init__(self, replica: int, capacity: int, page_size: int, policy: str) -> None:
        self.id = replica
        self.cache = RadixCache(capacity, page_size=page_size, policy=make_policy(policy))
        self.key_of_block: list[Hashable] = [None] * capacity  # the page key each tree block holds
        self.held: dict[Hashable, int] = {}  # key -> tree blocks holding it (1 unless ids are not chained)
        self.removed: list[Hashable] = []  # keys gone since the last batch (on_evict appends)
        self.seq = 0
        self.queue: deque[_Job] = deque()
        self.busy = False
        self.busy_s = self.ttft_s = 0.0
        self.requests = self.prompt_tokens = self.hit_tokens = 0
        self.cache.on_evict = self._evicted

    def _evicted(self, leaf: object, keep: int, blocks: Sequence[int]) -> None:
        held, key_of = self.held, self.key_of_block
        for b in blocks:
            key = key_of[b]
            n = held[key] - 1
            if n:
                held[key] = n
            else:
                del held[key]
                self.removed.append(key)

    def adopted(self, keys: list, blocks: Sequence[int]) -> list:
        """Record that the tree adopted `blocks` holding `keys`; the keys it did not hold before."""
        held, key_of = self.held, self.key_of_block
        stored = []
        for key, b in zip(keys, blocks, strict=True):
            key_of[b] = key
            n = held.get(key, 0)
            held[key] = n + 1
            if not n:
                stored.append(key)
        return stored


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
        policy: str = "lru",
        costs: RoutingCosts = DEFAULT_ROUTING_COSTS,
        seed: int = 0,
        record: bool = False,
        check: bool = False,
    ) -> None:
        if type(replicas) is not int or replicas < 1:
            raise RadixCacheError(f"replicas must be a positive int, got {replicas!r}")
        if type(capacity_blocks) is not int or capacity_blocks < 1:
            raise RadixCacheError(f"capacity_blocks must be a positive int, got {capacity_blocks!r}")
        if not isinstance(costs, RoutingCosts):
            raise RadixCacheError(f"costs must be a RoutingCosts, got {type(costs).__name__}")
        if isinstance(router, str):
            router = make_router(router, seed=seed) if router == "power_of_two" else make_router(router)
        self.router = router
        self.capacity_blocks, self.policy = capacity_blocks, make_policy(policy).name
        self.page_size, self.block_tokens, self.kind = page_size, block_tokens, kind
        self.costs = costs
        self.prefill_s = costs.prefill_ms_per_token / 1000
        self.decode_s = costs.decode_ms_per_token / 1000
        self.index = RouterIndex()
        self.loads = LoadTracker(self.prefill_s, self.decode_s)
        self.replicas = [_Replica(r, capacity_blocks, page_size, policy) for r in range(replicas)]
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
        route = RouteRequest(keys, request.prompt_tokens, out, self.page_size * request.unit, request.session)
        r, matched = self.router.route(route, self.ids, self.index, self.loads)
        replica = self.replicas[r]
        self.loads.dispatched(r, rid, route.uncached_tokens(matched), out)
        replica.queue.append(_Job(rid, t, request, out, keys, chain))
        if not replica.busy:
            self._start(replica, t)

    def _start(self, replica: _Replica, now: float) -> None:
        """Serve the next request of `replica`'s queue from `now`: match, lock, allocate, schedule its prefill end
        and its finish."""
        job = replica.queue.popleft()
        replica.busy = True
        cache, p, request = replica.cache, self.page_size, job.request
        full = as_token_array(request.prompt + request.output if request.output else request.prompt)
        prompt = full[: len(request.prompt)] if request.output else full
        match = cache.match_prefix(prompt, namespace=request.namespace)
        cache.lock(match.node)
        matched_pages = len(match.blocks)
        need = -(-len(full) // p) - matched_pages
        room = cache.free_blocks + cache.evictable_blocks
        if need > room:  # larger than what the cache can free: cache the whole pages that fit
            need = room
            full = full[: (matched_pages + room) * p]
        new = cache.allocate(need)
        self._publish(replica, [])
        job.node, job.full, job.blocks = match.node, full, match.blocks + new
        job.prompt_pages = min(len(request.prompt) // p, len(full) // p)
        tokens = request.prompt_tokens
        hit = min(match.length * request.unit, tokens)
        self.loads.started(replica.id, job.rid, tokens - hit)
        prefill = (tokens - hit) * self.prefill_s
        service = prefill + job.out * self.decode_s
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

    def _prefilled(self, replica: _Replica, job: _Job) -> None:
        """The prompt is computed: its full pages enter the tree (still locked by the match below them)."""
        self.loads.prefill_done(replica.id, job.rid)
        pages = job.prompt_pages
        if pages:
            self._insert(replica, job, pages)

    def _finished(self, replica: _Replica, job: _Job, now: float) -> None:
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

    def _insert(self, replica: _Replica, job: _Job, pages: int) -> None:
        p = self.page_size
        cached = replica.cache.insert(job.full[: pages * p], job.blocks[:pages], namespace=job.request.namespace) // p
        if pages > cached:
            keys = self._keys_upto(job, pages)
            self._publish(replica, replica.adopted(keys[cached:pages], job.blocks[cached:pages]))

    def _publish(self, replica: _Replica, stored: list) -> None:
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
            ids = list(request.prompt)
            return (ids if request.namespace is None else [(request.namespace, i) for i in ids]), None
        root = self._roots.get(request.namespace)
        if root is None:
            root = self._roots[request.namespace] = root_hash(_FINGERPRINT, request.namespace)
        chain = PageChain(root, self.page_size)
        return chain.upto(request.prompt, len(request.prompt) // self.page_size), chain

    def _keys_upto(self, job: _Job, pages: int) -> list:
        if job.chain is None:  # a hash request: a page is an id
            return job.keys[:pages]
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


def simulate_routing(
    workload: Workload | TraceSource | RoutedWorkload,
    replicas: int,
    capacity_blocks: int,
    router: str | Router = "cache_aware",
    *,
    policy: str = "lru",
    costs: RoutingCosts = DEFAULT_ROUTING_COSTS,
    rate: float | None = None,
    arrivals: str = "poisson",
    seed: int = 0,
    router_params: Mapping[str, object] | None = None,
    progress: Callable[[int], None] | None = None,
    check: bool = False,
) -> RoutingResult:
    """Replay `workload` (an in-memory Workload or RoutedWorkload, or a streamed TraceSource) through `replicas`
    replicas of `capacity_blocks` blocks each, behind `router` (a name from radixcache.router.ROUTERS, with
    `router_params`, or a Router). Arrivals at the trace's timestamps, or at `rate` requests/s (`arrivals`
    "poisson", seeded with `seed`, or "even"). `seed` also seeds power_of_two. `check`: the index is checked
    against every replica's tree after every event (slow: for tests)."""
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
    )
    replay.rate = rate
    return replay.run(arrival_times(routed_requests(workload), rate, arrivals, seed), progress)


# ---------------------------------------------------------------------------------------------- sweeps

SYNTHETIC = "synthetic:"


@dataclass(frozen=True, slots=True)
class RoutingCell:
    """One routed replay of a sweep: trace `index` (named `name`) through `replicas` replicas behind `router`."""

    index: int
    name: str
    router: str
    replicas: int
    capacity_blocks: int
    rate: float | None  # requests/s for the whole cluster, None for the trace's timestamps


@dataclass(frozen=True, slots=True)
class RoutingRow:
    """One cell's figures (a row of scripts/simulate_routing.py's CSV)."""

    trace: str
    router: str
    replicas: int
    capacity_blocks: int
    rate: float | None
    requests: int
    hit_rate: float
    imbalance: float
    utilisation: float
    ttft_p50_s: float
    ttft_p99_s: float
    ttft_mean_s: float
    events_per_s: float
    peak_index_pages: int
    seconds: float


def load_routing_trace(spec: str, page_size: int, block_size: int) -> tuple[str, Workload | TraceSource]:
    """(name, workload) of a trace file (streamed, its path made absolute so other processes find it) or of
    `synthetic:KIND` (the generator's defaults in memory, at `page_size`)."""
    if spec.startswith(SYNTHETIC):
        kind = spec[len(SYNTHETIC) :]
        if kind not in GENERATORS:
            raise RadixCacheError(f"{spec}: choose one of {SYNTHETIC}{f', {SYNTHETIC}'.join(GENERATORS)}")
        return kind, token_workload(GENERATORS[kind](), page_size)
    path = Path(spec).resolve()
    page = None if FORMAT_KINDS.get(detect_format(path)) == "hash" else page_size
    return path.stem, open_source(path, page_size=page, block_size=block_size)


class RoutingCellRunner:
    """Runs cells in a worker, loading each trace from its spec on first use (synthetic workloads are kept: a
    worker runs a trace's cells one after another)."""

    def __init__(
        self,
        specs: list[str],
        page_size: int,
        block_size: int,
        costs: RoutingCosts = DEFAULT_ROUTING_COSTS,
        seed: int = 0,
    ) -> None:
        self.specs, self.page_size, self.block_size = list(specs), page_size, block_size
        self.costs, self.seed = costs, seed
        self._loaded: tuple[int, Workload | TraceSource] | None = None

    def workload(self, index: int) -> Workload | TraceSource:
        if self._loaded is None or self._loaded[0] != index:
            self._loaded = None  # free the previous trace first
            self._loaded = (index, load_routing_trace(self.specs[index], self.page_size, self.block_size)[1])
        return self._loaded[1]

    def run(self, cell: RoutingCell) -> RoutingRow:
        r = simulate_routing(
            self.workload(cell.index),
            cell.replicas,
            cell.capacity_blocks,
            cell.router,
            costs=self.costs,
            rate=cell.rate,
            seed=self.seed,
        )
        return RoutingRow(
            cell.name,
            cell.router,
            cell.replicas,
            cell.capacity_blocks,
            cell.rate,
            r.requests,
            r.hit_rate,
            r.imbalance,
            r.utilisation,
            r.ttft.p50_s,
            r.ttft.p99_s,
            r.ttft.mean_s,
            r.events.events_per_s,
            r.events.peak_index_pages,
            r.seconds,
        )


_runner: RoutingCellRunner | None = None  # a worker process's own


def _init_worker(specs: list[str], page_size: int, block_size: int, costs: RoutingCosts, seed: int) -> None:
    global _runner
    _runner = RoutingCellRunner(specs, page_size, block_size, costs, seed)


def _run_in_worker(cell: RoutingCell) -> RoutingRow:
    assert _runner is not None, "the pool's initializer sets the runner"
    return _runner.run(cell)


def run_routing_cells_in_processes(
    cells: list[RoutingCell], runner: RoutingCellRunner, workers: int
) -> Iterator[RoutingRow]:
    """Run `cells` on `workers` fresh processes; rows in cell order."""
    context = multiprocessing.get_context("spawn")  # no fork of a threaded parent (the progress bar)
    init = (runner.specs, runner.page_size, runner.block_size, runner.costs, runner.seed)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker, initargs=init) as pool:
        yield from pool.map(_run_in_worker, cells)


def start_ray(address: str | None, cpus: int | None, workers: int | None) -> int:
    """Join the Ray cluster at `address`, or start a local one of `cpus` CPUs (default: every core); returns
    `workers`, or the cluster's CPUs. Raises RadixCacheError when Ray is not installed."""
    try:
        import ray
    except ImportError:
        raise RadixCacheError(
            "--ray needs Ray, which is not installed: pip install 'radixcache[cluster]' (or pip install 'ray>=2.60')"
        ) from None
    if address is not None:
        ray.init(address=address)
    else:
        ray.init(num_cpus=cpus, include_dashboard=False)
    return workers or max(1, int(ray.cluster_resources().get("CPU", 1)))


def run_routing_cells_on_ray(cells: list[RoutingCell], runner: RoutingCellRunner, workers: int) -> Iterator[RoutingRow]:
    """Run `cells` on `workers` Ray actors (one CPU each) after `start_ray`; rows in cell order. Every node needs
    radixcache installed and the trace files at the same paths."""
    import ray
    from ray.util import ActorPool

    actor = ray.remote(num_cpus=1)(RoutingCellRunner)
    args = (runner.specs, runner.page_size, runner.block_size, runner.costs, runner.seed)
    pool = ActorPool([actor.remote(*args) for _ in range(workers)])
    try:
        yield from pool.map(lambda a, cell: a.run.remote(cell), cells)
    finally:
        ray.shutdown()
