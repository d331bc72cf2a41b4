#!/usr/bin/env python
"""What the router's index costs a deployment of N replicas: memory, event throughput, and the cost of a route.

The index (radixcache.router.RouterIndex) is filled with --pages-per-replica chained page keys per replica (16-byte
blake2b digests, as the runtime's radixcache.page_hash makes them), then fed a steady synthetic stream: batches of
--batch stored keys and --batch removed keys (the replica's oldest), so every set keeps its size, on random
replicas, --rate page events per second for --seconds of stream time. The stream is applied as fast as it goes;
the share of one core it needs at --rate is the time taken over the stream's seconds. The baseline, measured in
the same run on the same stream, is the bare set updates with no sequence check. Last, a route: matching a
request's page keys against every replica (what cache_aware and sglang do per request).

Example:
  .venv/bin/python scripts/bench_router_index.py --replicas 64 --pages-per-replica 20000 --rate 80000
"""

from __future__ import annotations

import gc
import json
import math
import random
import sys
import time
import tracemalloc
from collections import deque
from hashlib import blake2b

import click

from radixcache.router import EventBatch, LoadTracker, RouteRequest, RouterIndex, make_router

MAX_EVENTS = 10**7  # the stream is made whole before it is timed: 60x the default's, a few GiB


def page_keys(rng: random.Random, n: int) -> list[bytes]:
    """n distinct 16-byte keys (chained hashes look random; a chain is not needed to measure a set)."""
    return [blake2b(rng.randbytes(16), digest_size=16).digest() for _ in range(n)]


def bench(replicas: int, pages: int, batch: int, rate: float, seconds: float, seed: int = 0) -> dict:
    rng = random.Random(seed)
    # ------------------------------------------------------------------ fill, under tracemalloc
    fills = [page_keys(rng, pages) for _ in range(replicas)]
    gc.collect()
    tracemalloc.start()
    index = RouterIndex()
    for r in range(replicas):
        index.add_replica(r)
        assert index.apply(EventBatch(r, 1, tuple(fills[r])))
    sets_bytes = tracemalloc.get_traced_memory()[0]  # the sets' tables (the keys were allocated before)
    tracemalloc.stop()
    keys_bytes = sum(sys.getsizeof(k) for keys in fills for k in keys)
    # ------------------------------------------------------------------ the stream
    events = int(rate * seconds)
    batches = max(1, events // (2 * batch))
    fifo = [deque(keys) for keys in fills]
    stream = []
    for _ in range(batches):
        r = rng.randrange(replicas)
        stored = tuple(page_keys(rng, batch))
        removed = tuple(fifo[r].popleft() for _ in range(batch))
        fifo[r].extend(stored)
        stream.append((r, stored, removed))
    seq = [1] * replicas
    made = []
    for r, stored, removed in stream:
        seq[r] += 1
        made.append(EventBatch(r, seq[r], stored, removed))
    bare = [set(keys) for keys in fills]
    started = time.perf_counter()
    for r, stored, removed in stream:
        keys = bare[r]
        keys.difference_update(removed)
        keys.update(stored)
    baseline_s = time.perf_counter() - started
    started = time.perf_counter()
    for b in made:
        index.apply(b)
    index_s = time.perf_counter() - started
    applied = batches * 2 * batch
    assert all(index.pages(r) == pages for r in range(replicas)), "the stream keeps every set's size"
    # ------------------------------------------------------------------ routes
    loads = LoadTracker()
    router = make_router("cache_aware")
    everyone = list(range(replicas))
    requests = []
    for _ in range(200):  # half of each request's 128 pages cached on one replica
        r = rng.randrange(replicas)
        keys = list(fifo[r])[-64:] + page_keys(rng, 64)
        requests.append(RouteRequest(keys, 128 * 16, 100, 16))
    started = time.perf_counter()
    for req in requests:
        router.choose(req, everyone, index, loads)
    route_s = (time.perf_counter() - started) / len(requests)
    return {
        "replicas": replicas,
        "pages_per_replica": pages,
        "index_pages": index.total_pages(),
        "index_sets_mib": sets_bytes / 2**20,
        "index_keys_mib": keys_bytes / 2**20,
        "index_bytes_per_page": (sets_bytes + keys_bytes) / (replicas * pages),
        "stream_events": applied,
        "stream_batches": batches,
        "stream_seconds": applied / rate,
        "apply_events_per_s": applied / index_s,
        "baseline_events_per_s": applied / baseline_s,
        "index_over_baseline": index_s / baseline_s,
        "core_share_at_rate": index_s / (applied / rate),
        "route_us": route_s * 1e6,
    }


@click.command()
@click.option("--replicas", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--pages-per-replica", default=20_000, show_default=True, type=click.IntRange(min=1))
@click.option("--batch", default=16, show_default=True, type=click.IntRange(min=1), help="Keys stored (and removed).")
@click.option("--rate", default=80_000.0, show_default=True, type=click.FloatRange(min=1), help="Page events/s.")
@click.option("--seconds", default=2.0, show_default=True, type=click.FloatRange(min=0.01), help="Stream length.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def main(replicas: int, pages_per_replica: int, batch: int, rate: float, seconds: float, as_json: bool) -> None:
    """Memory, event throughput and route cost of the router's index for N replicas."""
    # NaN passes FloatRange and inf past its minimum: int(rate * seconds) raised after the fill; a huge product ran
    # out of memory making the stream
    if not math.isfinite(rate * seconds) or rate * seconds > MAX_EVENTS:
        raise click.BadParameter(f"--rate x --seconds must be finite and at most {MAX_EVENTS:,} page events")
    if pages_per_replica < batch:
        raise click.BadParameter("--pages-per-replica must be at least --batch (each batch removes --batch keys)")
    out = bench(replicas, pages_per_replica, batch, rate, seconds)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(
        f"{out['replicas']} replicas x {out['pages_per_replica']:,} pages = {out['index_pages']:,} keys: "
        f"{out['index_sets_mib']:.1f} MiB of sets + {out['index_keys_mib']:.1f} MiB of 16-byte keys "
        f"({out['index_bytes_per_page']:.0f} bytes a page)"
    )
    click.echo(
        f"stream: {out['stream_events']:,} page events in {out['stream_batches']:,} batches ({rate:,.0f} events/s "
        f"for {out['stream_seconds']:.1f} s): applied at {out['apply_events_per_s']:,.0f} events/s, "
        f"{out['index_over_baseline']:.2f}x the bare set updates ({out['baseline_events_per_s']:,.0f} events/s); "
        f"{out['core_share_at_rate']:.1%} of one core at {rate:,.0f} events/s"
    )
    click.echo(f"route (cache_aware over {replicas} replicas, 128-page prompt): {out['route_us']:,.0f} us")


if __name__ == "__main__":
    main()
