"""bench_engine.py's sessions measurement: concurrent multi-turn sessions sharing system prompts, sequential
without and with the cache, then batched under each schedule."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from bench_engine_kit import PAGE, Bench, conversations, pct, user_msg

from radixcache.runtime import Engine


def summary(name: str, engine: Engine, results: list[Any], wall: float) -> dict[str, Any]:
    ttft = [r.ttft_s for r in results]
    gen = sum(len(r.token_ids) for r in results)
    s = engine.stats
    row = {
        "setup": name,
        "tok_s": gen / wall,
        "ttft_p50": statistics.median(ttft),
        "ttft_p99": pct(ttft, 0.99),
        "hit_rate": s.hit_rate,
        "preempt": s.preemptions,
        "wall": wall,
    }
    print(
        f"  {name:28s} {row['tok_s']:7.1f} tok/s  TTFT p50 {row['ttft_p50']:.3f}s p99 {row['ttft_p99']:.3f}s  "
        f"hit {row['hit_rate']:.3f}  preempt {row['preempt']}  wall {wall:.1f}s",
        flush=True,
    )
    return row


def run_sequential(engine: Engine, n: int, turns: int, max_new: int, repeat: int) -> tuple[list[Any], float]:
    convs = conversations(n, repeat)
    out = []
    t0 = time.perf_counter()
    for k in range(turns):  # interleaved: turn k of every session, then turn k + 1
        for i, conv in enumerate(convs):
            conv.append(user_msg(i, k))
            r = engine.chat(conv, max_new, ignore_eos=True)
            conv.append({"role": "assistant", "content": r.text})
            out.append(r)
    return out, time.perf_counter() - t0


def run_concurrent(engine: Engine, n: int, turns: int, max_new: int, repeat: int) -> tuple[list[Any], float]:
    convs = conversations(n, repeat)
    out: list[Any] = []

    async def session(i: int) -> None:
        conv = convs[i]
        for k in range(turns):
            conv.append(user_msg(i, k))
            r = await engine.achat(conv, max_new, ignore_eos=True)
            conv.append({"role": "assistant", "content": r.text})
            out.append(r)

    async def main() -> None:
        await asyncio.gather(*(session(i) for i in range(n)))

    t0 = time.perf_counter()
    asyncio.run(main())
    return out, time.perf_counter() - t0


def bench_sessions(b: Bench) -> None:
    a = b.args
    w = (a.sessions, a.turns, a.max_new, a.repeat)
    rows = []
    print(f"sessions: {a.sessions} sessions x {a.turns} turns x {a.max_new} new tokens, pool {a.kv_blocks} pages")
    if not a.skip_sequential:
        e = b.engine(enable_cache=False)
        rows.append(summary("sequential, no cache", e, *run_sequential(e, *w)))
        e = b.engine()
        rows.append(summary("sequential, cache", e, *run_sequential(e, *w)))
    for schedule in ("fcfs", "lpm", "dfs-weight"):
        e = b.engine(schedule=schedule)
        res, wall = run_concurrent(e, *w)
        e.cache.check_invariants()
        assert e.cache.locked_blocks == 0
        rows.append(summary(f"continuous batching, {schedule}", e, res, wall))
    b.data["sessions"] = rows
    b.table(
        ["set-up", "tokens/s", "TTFT p50", "TTFT p99", "hit rate", "preemptions", "wall"],
        [
            [
                r["setup"],
                f"{r['tok_s']:.1f}",
                f"{r['ttft_p50']:.3f} s",
                f"{r['ttft_p99']:.3f} s",
                f"{r['hit_rate']:.3f}",
                str(r["preempt"]),
                f"{r['wall']:.1f} s",
            ]
            for r in rows
        ],
        f"Sessions: {a.sessions} x {a.turns} turns x {a.max_new} new tokens, 4 shared system prompts, "
        f"pool {a.kv_blocks} pages of {PAGE}.",
    )
