"""What every replay of one cache shares: the workload it takes, the pass that feeds it, how a request meets the
tree (its clock at arrival, the pages it shares early, its finish), and the SimResult its counters make.

A replay (CacheReplay, TieredReplay, InfiniteReplay, the flat ones) is fed request by request (`feed`), then
`close`d and read; `drive` feeds one workload to several replays in one pass.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, Union

from radixcache.cache import RadixCache
from radixcache.errors import RadixCacheError
from radixcache.sim.inflight import InFlight
from radixcache.sim.results import SimResult
from radixcache.sim.tiers import TierResult
from radixcache.sim.timeline import Timeline
from radixcache.tokens import as_token_array
from radixcache.trace.workload import SimRequest, Workload

if TYPE_CHECKING:
    from radixcache.sim.source import TraceSource

#: what `simulate` replays: requests in memory, or a trace file streamed (radixcache.sim.source)
Replayable = Union[Workload, "TraceSource"]


def prompt_blocks(request: SimRequest, page_size: int) -> int:
    """Blocks of `request`'s prompt, its partial last page included: one that can miss, as `block_hit_rate` counts
    it. A request an engine recorded (`holds_tail`) looks up only its prompt's whole pages, so its partial last page
    is added here: it always misses (the engine's tree never holds it), as it can in a trace that looks it up."""
    pages = -(-len(request.prompt) // page_size)
    return pages + (request.holds_tail and request.prompt_tokens > pages * page_size * request.unit)


class ReplayCounters(Protocol):
    """The counters every replay keeps, which `replay_figures` reads into a SimResult."""

    timeline: Timeline
    page_size: int
    block_tokens: int
    concurrency: int
    prompt_blocks: int
    hit_blocks: int
    seconds: float


class OneCacheReplay:
    """What a replay through one device cache (CacheReplay, TieredReplay) counts and holds besides its cache: the
    blocks and hits of its requests, their time windows, the requests in flight, and those larger than what the
    cache could free (`oversized`)."""

    def __init__(
        self, workload: Replayable, capacity_blocks: int, concurrency: int, check: bool, windows: int, honor: bool
    ) -> None:
        self.capacity_blocks = capacity_blocks
        self.page_size, self.block_tokens = workload.page_size, workload.block_tokens
        self.concurrency = concurrency
        self.check = check
        self.honor_timestamps = honor
        self.timeline = Timeline(windows, trace_span(workload))
        self.inflight = InFlight(concurrency)
        self.prompt_blocks = self.hit_blocks = self.oversized = 0
        self.seconds = 0.0


def request_tokens(request: SimRequest) -> tuple[array, array]:
    """A request's prompt plus output, and its prompt, validated once as int64 arrays, which the cache's match and
    insert then take without another pass."""
    full = as_token_array(request.prompt + request.output if request.output else request.prompt)
    return full, (full[: len(request.prompt)] if request.output else full)


def holds_engine_tail(request: SimRequest, full: array, page_size: int) -> bool:
    """Whether the engine that recorded `request` (`holds_tail`) held, while it ran, a page besides the whole pages
    `full` gives: the partial page it was still writing. It writes every token but the last it generated (that
    one is never fed back), so a request whose other tokens end on a page boundary held no such page (1,193
    prompt tokens and 24 generated at 16 a page: 76 whole pages, none partial)."""
    if not request.holds_tail or len(full) % page_size:
        return False
    written = request.prompt_tokens + max((request.output_tokens or 0) - 1, 0)
    return written % (page_size * request.unit) != 0


def fit_request(cache: RadixCache, full: array, matched_pages: int) -> tuple[array, int, int, bool]:
    """(tokens, need, room, cut): the blocks a request of `full` tokens needs past its `matched_pages`, and the blocks
    the cache can free. A request that needs more than that caches the whole pages that fit: its tokens are `cut`
    to them."""
    p = cache.page_size
    need = -(-len(full) // p) - matched_pages
    room = cache.free_blocks + cache.evictable_blocks
    if need > room:
        return full[: (matched_pages + room) * p], room, room, True
    return full, need, room, False


def trace_span(workload: Replayable) -> tuple[float, float] | None:
    """The first and last timestamps, when they can be known before the replay (None: an empty trace, or a
    stream whose end cannot be read first)."""
    if isinstance(workload, Workload):
        reqs = workload.requests
        return (reqs[0].timestamp_ms, reqs[-1].timestamp_ms) if reqs else None
    return workload.span()


def drive(workload: Replayable, replays: list, progress: Callable[[int], None] | None) -> None:
    """One pass over the workload, each request fed to every replay in turn."""
    count = 0
    for index, request in enumerate(workload):
        for replay in replays:
            replay.feed(index, request)
        count = index + 1
        if progress is not None and index % 256 == 255:
            progress(256)
    for replay in replays:
        replay.close()
    if progress is not None and count % 256:
        progress(count % 256)


def replay_figures(
    replay: ReplayCounters,
    policy: str,
    capacity: int,
    evicted: int,
    oversized: int,
    tiers: TierResult | None = None,
) -> SimResult:
    """A replay's figures: its counters and time windows, with what only its kind knows."""
    t = replay.timeline
    return SimResult(
        policy=policy,
        capacity_blocks=capacity,
        page_size=replay.page_size,
        block_tokens=replay.block_tokens,
        concurrency=replay.concurrency,
        requests=t.requests,
        prompt_tokens=t.prompt_tokens,
        hit_tokens=t.hit_tokens,
        prompt_blocks=replay.prompt_blocks,
        hit_blocks=replay.hit_blocks,
        evicted_blocks=evicted,
        oversized_requests=oversized,
        windows=t.windows(),
        seconds=replay.seconds,
        tiers=tiers,
        clock="timestamps" if getattr(replay, "honor_timestamps", False) else "requests",
        in_flight=getattr(getattr(replay, "inflight", None), "overlapped", False),
    )


def shared_early(request: SimRequest, pages: int, p: int) -> int:
    """How many of a request's `pages` (of p cache tokens) the tree holds from the moment it starts.

    An engine shares a prompt's pages as soon as it computes them, and one that arrives meanwhile with the same prefix
    reuses them (the engine's in-flight sharing). A request an engine recorded (it says when it finished:
    `finish_ms`) therefore gives the tree its prompt's whole pages when it starts, and the rest when it finishes.
    Any other request gives them all when it finishes (0 here).
    """
    if request.finish_ms is None:
        return 0
    return min(request.prompt_tokens // request.unit // p, pages)


def prompt_commits(request: SimRequest, matched: int, early: int, p: int, chunk: int | None) -> list[int]:
    """The page counts at which a recorded request's prompt enters the tree at its start, ascending, the last
    `early` (see `shared_early`; `matched` pages it hit). `chunk` None: all at once. Else as the engine committed
    them: it prefills from its match (less one token when the match covers the whole prompt: the engine computes the
    last token again for its logits) `chunk` real tokens a pass, and after each pass the tree takes the whole pages
    computed so far."""
    if chunk is None:
        return [early]
    per_page = p * request.unit
    computed = min(matched * per_page, request.prompt_tokens - 1)
    out: list[int] = []
    while not out or out[-1] < early:
        computed = min(computed + chunk, request.prompt_tokens)
        pages = min(computed // per_page, early)
        if pages > (out[-1] if out else matched):
            out.append(pages)
    return out


def advance_to_arrival(cache: RadixCache, request: SimRequest) -> None:
    """Move the cache's clock to the request's arrival time, in microseconds (`honor_timestamps`)."""
    at = request.timestamp_ms * 1000
    if at == math.inf:  # a finite timestamp past 1.8e305 ms: no float (the policies' intervals) can hold it in µs
        raise RadixCacheError(f"timestamp {request.timestamp_ms!r} ms is too large for the cache's clock in µs")
    at = int(at)
    if at > 0:
        cache.advance_clock(at)


def finish_into_tree(cache: RadixCache, item: tuple, p: int) -> None:
    """A finished request's pages enter the tree, its unaligned tail page is freed, and its match is unlocked.
    `item`: (the locked node, its tokens, its blocks, its namespace)."""
    node, full, blocks, namespace = item
    cache.insert(full, blocks, namespace=namespace)
    if len(full) % p:
        cache.free(blocks[-1:])  # the unaligned tail page never enters the tree
    cache.unlock(node)


def check_flags(**flags: object) -> None:
    """RadixCacheError naming the first flag that is no bool: a string read from a config ("false") is truthy, and
    would silently run Belady's replays, or the per-request invariant check, or change the clock."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise RadixCacheError(f"{name} must be True or False, got {value!r}")


def check_progress(progress: object) -> None:
    """RadixCacheError unless `progress` is None or callable: else a TypeError came at its first call, 256 requests
    into the replay (minutes, on a large trace)."""
    if progress is not None and not callable(progress):
        raise RadixCacheError(f"progress must be a function of the requests replayed, or None, got {progress!r:.40}")


def check_workload(workload: object) -> None:
    """RadixCacheError unless `workload` is a workload (a Workload, a TraceSource, a RoutedWorkload: each has a
    page size): a list of TokenRequests, which the runtime's replay takes, was an AttributeError ('page_size')."""
    if not hasattr(workload, "page_size") or not hasattr(workload, "block_tokens"):
        raise RadixCacheError(
            "workload must be a Workload (radixcache.trace.workload.token_workload(requests)) or a TraceSource "
            f"(radixcache.sim.open_source(path)), got {type(workload).__name__}"
        )
