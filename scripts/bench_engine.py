"""Benchmark continuous batching and cache-aware scheduling on SmolLM2: 16 concurrent multi-turn sessions.

    .venv/bin/python scripts/bench_engine.py                  # CPU, about 3 minutes on 2 cores
    .venv/bin/python scripts/bench_engine.py --device cuda    # on a GPU

Set-ups, all on one model loaded once, every baseline measured in the same run:
- sequential without cache: the turns one at a time (interleaved across sessions), cache off
- sequential with cache: the same order, cache on
- continuous batching with cache, under each schedule (fcfs, lpm, dfs-weight): each session is a task that
  sends its turns in order; all 16 run at once through the scheduler

Workload: 16 sessions in 4 groups; each group shares a long system prompt (tool definitions), each session adds
its own user turns and the model's replies (greedy). `--kv-blocks 48` makes the pool smaller than the working
set, so admission is bounded by memory and eviction decides what is still cached.

Reports generated tokens/s over the wall time, TTFT p50/p99, the hit rate (prompt tokens served from the cache,
recomputation after preemption not counted), preemptions. Then batched decode: tokens/s of one decode step at
batch 8 against batch 1 (target >= 3x), and end to end through the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from radixcache.runtime import Engine
from radixcache.runtime.loading import load_model
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel

TOOLS = [
    "search(query: str) -> list of web results; fetch(url: str) -> page text; calculator(expr: str) -> number",
    "sql(query: str) -> rows from the sales database; plot(rows, x, y) -> image; email(to, subject, body)",
    "git_log(path) -> commits; read_file(path) -> text; run_tests(pattern) -> report; open_pr(title, body)",
    "weather(city) -> forecast; flights(src, dst, date) -> offers; book(offer_id) -> booking; calendar(day)",
]
QUESTIONS = [
    "What should I check first?",
    "Give me one concrete step.",
    "Why that one?",
    "And after that?",
    "Summarise in one line.",
]


def system_prompt(group: int, repeat: int) -> str:
    return (
        f"You are agent {group}, a careful assistant. Tools available: {TOOLS[group]}. "
        + "Answer briefly, call at most one tool per turn, and explain your reasoning. " * repeat
    )


def conversations(n: int, repeat: int) -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": system_prompt(i % 4, repeat)}] for i in range(n)]


def user_msg(session: int, turn: int) -> dict[str, str]:
    return {"role": "user", "content": f"Task {session}: {QUESTIONS[(session + turn) % len(QUESTIONS)]}"}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


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


def bench_batched_decode(model: LlamaModel, smol: Any, ctx: int, reps: int) -> list[tuple[int, float]]:
    """Tokens/s of one decode step over `b` sequences of ~ctx tokens (distinct block tables)."""
    page = 16
    per = -(-ctx // page) + 1
    pool = model.new_pool(per * 16, page)
    batches = (1, 8, 16)
    metas = {}
    for b in batches:
        tables = [[i * per + j for j in range(per)] for i in range(b)]
        metas[b] = build_decode_meta(tables, [ctx + i for i in range(b)], page, model.device)
    best = dict.fromkeys(batches, float("inf"))
    with torch.inference_mode():
        for b in batches:
            model.decode([5] * b, metas[b], pool)
        for _ in range(reps):  # the batches alternate, so that a noisy moment on a shared machine hits them all
            for b in batches:
                if model.device.type == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                model.decode([5] * b, metas[b], pool)
                if model.device.type == "cuda":
                    torch.cuda.synchronize()
                best[b] = min(best[b], time.perf_counter() - t)
    return [(b, b / best[b]) for b in batches]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=6, help="system prompt length knob (x ~15 tokens)")
    ap.add_argument("--kv-blocks", type=int, default=256, help="KV pool pages of 16 tokens")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--skip-sequential", action="store_true")
    ap.add_argument("--markdown", default=None, help="also write the table to this file")
    args = ap.parse_args()

    t = time.perf_counter()
    smol = load_model("smollm2", device=args.device)
    model = LlamaModel(smol.config, smol.weights, device=args.device)
    print(f"SmolLM2 loaded in {time.perf_counter() - t:.1f}s on {args.device}, torch threads {torch.get_num_threads()}")

    def engine(**kw: Any) -> Engine:
        return Engine(model, tokenizer=smol.tokenizer, capacity_blocks=args.kv_blocks, page_size=16, **kw)

    engine().chat([{"role": "user", "content": "warm up"}], 2)
    w = (args.sessions, args.turns, args.max_new, args.repeat)
    rows = []
    print(f"{args.sessions} sessions x {args.turns} turns x {args.max_new} new tokens, pool {args.kv_blocks} pages")
    if not args.skip_sequential:
        e = engine(enable_cache=False)
        rows.append(summary("sequential, no cache", e, *run_sequential(e, *w)))
        e = engine()
        rows.append(summary("sequential, cache", e, *run_sequential(e, *w)))
    for schedule in ("fcfs", "lpm", "dfs-weight"):
        e = engine(schedule=schedule)
        res, wall = run_concurrent(e, *w)
        e.cache.check_invariants()
        assert e.cache.locked_blocks == 0
        rows.append(summary(f"continuous batching, {schedule}", e, res, wall))

    decode = bench_batched_decode(model, smol, 256, 20)
    base = decode[0][1]
    print("batched decode step (context ~256):")
    for b, tps in decode:
        print(f"  batch {b:2d}: {tps:7.1f} tok/s  ({tps / base:.2f}x batch 1)")

    e2e = []
    prompts = [f"Write a short poem about the number {i}." for i in range(8)]
    for batch in (1, 8):
        e = Engine(model, tokenizer=smol.tokenizer, kv_memory="256MiB")
        t = time.perf_counter()
        res = e.generate(prompts[:batch], 32, ignore_eos=True)
        e2e.append((batch, sum(len(r.token_ids) for r in res) / (time.perf_counter() - t)))
    print("end to end, 32 new tokens each:")
    for b, tps in e2e:
        print(f"  batch {b}: {tps:.1f} tok/s ({tps / e2e[0][1]:.2f}x)")

    lines = [
        f"SmolLM2-135M-Instruct, {args.device} ({platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads), {args.sessions} sessions x {args.turns} turns x {args.max_new} new "
        f"tokens, 4 shared system prompts, pool {args.kv_blocks} pages of 16.",
        "",
        "| set-up | tokens/s | TTFT p50 | TTFT p99 | hit rate | preemptions | wall |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['setup']} | {r['tok_s']:.1f} | {r['ttft_p50']:.3f} s | {r['ttft_p99']:.3f} s | "
            f"{r['hit_rate']:.3f} | {r['preempt']} | {r['wall']:.1f} s |"
        )
    lines += ["", "| decode step | tokens/s | vs batch 1 |", "| --- | ---: | ---: |"]
    lines += [f"| batch {b} (context ~256) | {tps:.1f} | {tps / base:.2f}x |" for b, tps in decode]
    lines += [f"| engine end to end, batch {b} | {tps:.1f} | {tps / e2e[0][1]:.2f}x |" for b, tps in e2e]
    text = "\n".join(lines)
    print()
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
