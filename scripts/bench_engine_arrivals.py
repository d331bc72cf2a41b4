"""bench_engine.py's arrival measurements: decode stalls while a long prompt arriving mid-run is prefilled, and a
burst of requests sharing a system prompt with `share_in_flight` off and on."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from bench_engine_kit import PAGE, Bench, ints, pct

from radixcache.runtime.engine.scheduler import SchedulerConfig


def stall_run(
    b: Bench, short: list[list[int]], long: list[int] | None, config: SchedulerConfig
) -> tuple[list[tuple[float, float]], Any, tuple[float, float]]:
    """Decode `short` together; submit `long` once each has `stall_after` tokens. Returns the short requests'
    inter-token gaps as (end time, seconds), the long request's result (or None) and the window of its prefill:
    from its admission (the start of the step of its first chunk) to its first token (the pass of its last chunk
    emits the decodes' tokens just before it)."""
    a = b.args
    pages = sum((len(p) + a.stall_new) // PAGE + 2 for p in short) + (len(long) // PAGE + 2 if long else 0)
    e = b.engine(capacity_blocks=pages, scheduler_config=config)
    marks: list[list[tuple[float, int]]] = [[] for _ in short]
    ready = threading.Event()

    def listener(i: int) -> Callable[[Any], None]:
        def on_token(req: Any) -> None:  # on the engine loop thread, after each new token (and once at the end)
            n = len(req.output_ids)
            if not marks[i] or n > marks[i][-1][1]:
                marks[i].append((time.perf_counter(), n))
            if all(m and m[-1][1] >= a.stall_after for m in marks):
                ready.set()

        return on_token

    handles = e.submit(short, a.stall_new, ignore_eos=True)
    for i, h in enumerate(handles):
        h.request.listener = listener(i)
    long_result, window = None, (0.0, 0.0)
    if long is not None:
        while not ready.wait(0.005):
            if all(h.done() for h in handles):
                break
        handle = e.submit(long, 1)
        long_result = handle.result()
        req = handle.request
        start = req.t_admitted if req.t_admitted is not None else req.t_arrival
        window = (start, req.t_first_token if req.t_first_token is not None else start)
    for h in handles:
        h.result()
    gaps = [(t1, t1 - t0) for m in marks for (t0, n0), (t1, n1) in itertools.pairwise(m) if n1 == n0 + 1]
    return gaps, long_result, window


def bench_stall(b: Bench) -> None:
    a = b.args
    k = a.stall_running
    print(
        f"stall: {k} requests ({a.stall_prompt}-token prompts, {a.stall_new} new tokens) decoding; run 2 adds a "
        f"{a.stall_long}-token prompt once each has {a.stall_after} tokens"
    )
    short = b.prompts(k, a.stall_prompt)
    long = b.prompts(1, a.stall_long)[0]
    mixed = ints(a.stall_mixed)
    stall_run(b, short, long, SchedulerConfig(mixed_prefill_tokens=mixed[0]))  # warm-up
    rows, data = [], []
    for m in mixed:
        config = SchedulerConfig(mixed_prefill_tokens=m)
        alone, _, _ = stall_run(b, short, None, config)
        gaps, res, (t_submit, t_end) = stall_run(b, short, long, config)
        window = [g for t, g in gaps if t_submit < t <= t_end]
        base = [g for _, g in alone]
        every = [g for _, g in gaps]
        row = {
            "mixed_prefill_tokens": m,
            "alone_p50": pct(base, 0.5),
            "alone_p99": pct(base, 0.99),
            "window_p50": pct(window, 0.5),
            "window_p99": pct(window, 0.99),
            "window_gaps": len(window),
            "overall_p50": pct(every, 0.5),
            "overall_p99": pct(every, 0.99),
            "long_ttft": res.ttft_s,
        }
        row["p99_ratio"] = row["window_p99"] / row["alone_p99"]
        data.append(row)
        ms = {key: 1000 * v for key, v in row.items() if key.endswith(("p50", "p99"))}
        print(
            f"  mixed_prefill_tokens {m:4d}: alone p50 {ms['alone_p50']:.1f} p99 {ms['alone_p99']:.1f} ms | "
            f"during the long prefill p50 {ms['window_p50']:.1f} p99 {ms['window_p99']:.1f} ms ({len(window)} gaps), "
            f"overall p50 {ms['overall_p50']:.1f} p99 {ms['overall_p99']:.1f} ms | p99 ratio {row['p99_ratio']:.2f}x | "
            f"long TTFT {res.ttft_s:.3f}s",
            flush=True,
        )
        rows.append(
            [
                str(m),
                f"{ms['alone_p50']:.1f} / {ms['alone_p99']:.1f}",
                f"{ms['window_p50']:.1f} / {ms['window_p99']:.1f} ({len(window)})",
                f"{ms['overall_p50']:.1f} / {ms['overall_p99']:.1f}",
                f"{row['p99_ratio']:.2f}x",
                f"{res.ttft_s:.3f} s",
            ]
        )
    b.data["stall"] = data
    b.table(
        [
            "mixed_prefill_tokens",
            "alone p50 / p99 ms",
            "during long prefill p50 / p99 ms (gaps)",
            "with long, overall p50 / p99 ms",
            "p99 ratio",
            "long TTFT",
        ],
        rows,
        f"Decode stall: inter-token times of {k} decoding requests, alone and while a {a.stall_long}-token prompt "
        "is prefilled (target p99 ratio <= 3x).",
    )


# ---------------------------------------------------------------------------------------------- burst


def burst_run(b: Bench, prompts: list[list[int]], config: SchedulerConfig) -> tuple[list[Any], float]:
    a = b.args
    pages = sum((len(p) + a.burst_new) // PAGE + 2 for p in prompts)
    e = b.engine(capacity_blocks=pages, scheduler_config=config)

    async def one(i: int) -> Any:
        await asyncio.sleep(i * a.burst_gap)
        return await e.agenerate(prompts[i], a.burst_new, ignore_eos=True)

    async def main() -> list[Any]:
        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))

    results = asyncio.run(main())
    e.cache.check_invariants()
    return results, e.stats.hit_rate


def bench_burst(b: Bench) -> None:
    a = b.args
    n = a.burst_requests
    shared = b.prompts(1, a.burst_shared)[0]
    prompts = b.prompts(n, a.burst_tail, prefix=shared)
    print(
        f"burst: {n} requests, {a.burst_shared} shared + {a.burst_tail} own tokens, {a.burst_gap}s apart, "
        f"{a.burst_new} new tokens"
    )
    configs = {"before (share_in_flight=False)": SchedulerConfig(share_in_flight=False), "after": SchedulerConfig()}
    burst_run(b, b.prompts(n, a.burst_tail, prefix=b.prompts(1, a.burst_shared)[0]), SchedulerConfig())  # warm-up
    rows, data = [], []
    for name, config in configs.items():
        results, hit = burst_run(b, prompts, config)
        ttft = [r.ttft_s for r in results]
        p50 = statistics.median(ttft)
        cached = [r.cached_tokens for r in results]
        print(
            f"  {name:31s} hit {hit:.3f}  TTFT p50 {p50:.3f}s  cached {cached}  "
            f"TTFT {' '.join(f'{t:.3f}' for t in ttft)}",
            flush=True,
        )
        data.append({"setup": name, "hit_rate": hit, "ttft_p50": p50, "cached_tokens": cached, "ttft": ttft})
        rows.append(
            [name, f"{hit:.3f}", f"{p50:.3f} s", " / ".join(map(str, cached)), " / ".join(f"{t:.3f}" for t in ttft)]
        )
    b.data["burst"] = data
    b.table(
        ["set-up", "hit rate", "TTFT p50", "cached tokens per request", "TTFT per request (s)"],
        rows,
        f"Burst: {n} requests sharing a {a.burst_shared}-token prefix (+{a.burst_tail} own), arriving "
        f"{a.burst_gap} s apart, {a.burst_new} new tokens, fresh engine each.",
    )
