"""The requests a routing replay serves: each with the real tokens it decodes (`RoutedRequest`), streamed from a
trace file or held in memory (`RoutedWorkload`), and their arrival times (`arrival_times`)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from radixcache.errors import RadixCacheError
from radixcache.sim.source import TraceSource
from radixcache.trace.fields import MAX_TIMESTAMP_MS
from radixcache.trace.formats import iter_trace
from radixcache.trace.workload import SimRequest, Workload, load_workload

ARRIVALS = ("poisson", "even")
#: the latest arrival, in seconds, a rate may give: a trace's latest timestamp (radixcache.trace.fields), so that
#: an arrival plus the service of every request queued behind it stays a finite time
MAX_ARRIVAL_S = MAX_TIMESTAMP_MS / 1000


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
    if not math.isfinite(1 / rate):  # below ~5.6e-309 the mean gap is inf: every arrival at inf, every TTFT NaN
        raise RadixCacheError(f"rate {rate!r} requests/s is too small: its mean gap 1/rate is not a finite time")
    if arrivals not in ARRIVALS:
        raise RadixCacheError(f"arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    rng = random.Random(seed)
    t = 0.0
    for i, (request, out) in enumerate(requests):
        t = t + rng.expovariate(rate) if arrivals == "poisson" else i / rate
        if not t <= MAX_ARRIVAL_S:  # a finite mean gap still sums past the doubles: arrivals at inf, TTFTs NaN
            raise RadixCacheError(
                f"rate {rate!r} requests/s is too small for this trace: request {i} would arrive at {t:g} s, past "
                f"{MAX_ARRIVAL_S:.4g} s (a trace's latest timestamp)"
            )
        yield t, request, out
