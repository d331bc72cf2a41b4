"""Benchmark the engine on SmolLM2: multi-turn sessions, batched decode, batched prefill, decode stalls under a long
prefill, and a burst of requests sharing a system prompt.

    .venv/bin/python scripts/bench_engine.py                          # everything, CPU: several minutes on 2 cores
    .venv/bin/python scripts/bench_engine.py --quick                  # everything at tiny sizes (a smoke run)
    .venv/bin/python scripts/bench_engine.py --only prefill,stall     # some measurements
    .venv/bin/python scripts/bench_engine.py --device cuda --markdown out.md --json out.json
    .venv/bin/python scripts/bench_engine.py --threads 2 --reps 5     # torch threads, repetitions of `prefill`

Every baseline is measured in the same run, on one model loaded once (`--model`: "smollm2", a GGUF file or a Hugging
Face directory) and shared by every engine; each run below gets a fresh engine (an empty cache). `--only` takes a
comma-separated list of the measurements (default: all, in this order):

- sessions: 16 concurrent multi-turn sessions in 4 groups; each group shares a long system prompt (tool
  definitions), each session adds its own user turns and the model's replies (greedy). Set-ups: sequential without
  cache (the turns one at a time, interleaved across sessions), sequential with cache, and continuous batching with
  cache under each schedule (fcfs, lpm, dfs-weight): each session is a task that sends its turns in order, all at
  once through the scheduler. `--kv-blocks 48` makes the pool smaller than the working set, so admission is
  bounded by memory and eviction decides what is still cached. Prints generated tokens/s over the wall time, TTFT
  p50/p99, the hit rate (prompt tokens served from the cache; recomputation after preemption not counted) and
  preemptions.
- decode: tokens/s of one decode step at batch 1, 8, 16 (context ~256; target: batch 8 >= 3x batch 1), and end to
  end through the engine at batch 1 and 8 (32 new tokens each).
- prefill: batched prefill throughput. 8 requests with distinct prompts (random token ids, distinct from the
  first token: nothing shared, nothing cached) of 512 and of 64 tokens, max_new_tokens=1, submitted together;
  prefill tokens/s = prompt tokens / wall time from the submit to the last result. A: one request per pass
  (max_prefill_seqs=1, max_prefill_tokens=L); B: all 8 chunks in one pass (max_prefill_seqs=8,
  max_prefill_tokens=8L); prefill_chunk=L in both. After a warm-up, A and B alternate `--reps` times; prints the
  best of each, B/A (target for 512 tokens: >= 1.5x; on a CPU of few cores a 512-row product is already
  compute-bound, so expect less there) and the forward passes each run took.
- stall: 4 requests with short distinct prompts (32 tokens) decode 64 tokens each (ignore_eos). Run 1: the 4
  alone. Run 2: the same 4, plus a long prompt (2048 tokens, max_new_tokens=1) submitted once each of the 4 has
  produced 8 tokens. Every decode token's time is taken on the engine loop thread (the request listener). Prints
  p50/p99 of the 4 requests' inter-token times: run 1 overall, run 2 over the window while the long prompt is
  prefilled (its admission to its first token) and overall, the ratio of run 2's window p99 to run 1's p99 (target <=
  3x), and the long request's TTFT; for mixed_prefill_tokens 24 (the default: the long prompt is chunked), 64 and 512.
- burst: 4 requests, a shared system prompt of 600 tokens plus 20 distinct tokens each, arriving 0.3 s apart
  (asyncio tasks), 16 new tokens each. Before: share_in_flight=False (pages reach the tree only when a request
  leaves); after: the default (pages are committed as they are computed, so a request arriving while another
  computes the shared prefix hits it). Prints each request's cached tokens and TTFT, the hit rate and TTFT p50.

`--quick` shrinks every size (a few seconds of compute per measurement); explicit options still win over it.
`--markdown FILE` also writes the tables, `--json FILE` every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from radixcache.runtime import Engine
from radixcache.runtime.engine.scheduler import SchedulerConfig
from radixcache.runtime.loading import load_model
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel

MEASUREMENTS = ("sessions", "decode", "prefill", "stall", "burst")
PAGE = 16

# option: (full size, --quick size)
SIZES: dict[str, tuple[Any, Any]] = {
    "sessions": (16, 8),
    "turns": (2, 1),
    "max_new": (8, 4),
    "repeat": (6, 1),
    "decode_ctx": (256, 64),
    "decode_reps": (20, 3),
    "decode_new": (32, 4),
    "reps": (3, 1),
    "prefill_requests": (8, 8),
    "prefill_lens": ("512,64", "64,16"),
    "stall_running": (4, 4),
    "stall_prompt": (32, 16),
    "stall_new": (64, 24),
    "stall_after": (8, 4),
    "stall_long": (2048, 256),
    "stall_mixed": ("24,64,512", "24,512"),
    "burst_requests": (4, 4),
    "burst_shared": (600, 96),
    "burst_tail": (20, 8),
    "burst_gap": (0.3, 0.05),
    "burst_new": (16, 4),
}

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
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def passes(n: int) -> str:
    return f"{n} pass" if n == 1 else f"{n} passes"


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class Bench:
    """The loaded model, the options, and what every measurement reports (table lines and JSON)."""

    def __init__(self, args: argparse.Namespace, smol: Any, model: LlamaModel) -> None:
        self.args = args
        self.smol = smol
        self.model = model
        self.lines: list[str] = []
        self.data: dict[str, Any] = {}
        vocab = model.config.vocab_size
        eos = set(model.config.eos_token_ids) | set(getattr(smol.tokenizer, "eos_token_ids", ()) or ())
        lo = 32 if vocab > 1024 else 0  # past SmolLM2's special tokens
        self.vocab = [t for t in range(lo, vocab) if t not in eos]
        self.rng = random.Random(0)

    def engine(self, **kw: Any) -> Engine:
        kw.setdefault("capacity_blocks", self.args.kv_blocks)
        return Engine(self.model, tokenizer=self.smol.tokenizer, page_size=PAGE, **kw)

    def prompts(self, n: int, length: int, prefix: list[int] | None = None) -> list[list[int]]:
        """n random prompts of `length` tokens after `prefix`, distinct from their first token."""
        firsts = self.rng.sample(self.vocab, n)
        pre = list(prefix or [])
        return [[*pre, f, *self.rng.choices(self.vocab, k=length - 1)] for f in firsts]

    def table(self, head: list[str], rows: list[list[str]], title: str = "") -> None:
        out = [title, ""] if title else []
        out += ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        self.lines += [*out, ""]


# ---------------------------------------------------------------------------------------------- sessions


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


# ---------------------------------------------------------------------------------------------- decode


def bench_batched_decode(model: LlamaModel, ctx: int, reps: int) -> list[tuple[int, float]]:
    """Tokens/s of one decode step over `b` sequences of ~ctx tokens (distinct block tables)."""
    per = -(-ctx // PAGE) + 1
    pool = model.new_pool(per * 16, PAGE)
    batches = (1, 8, 16)
    metas = {}
    for b in batches:
        tables = [[i * per + j for j in range(per)] for i in range(b)]
        metas[b] = build_decode_meta(tables, [ctx + i for i in range(b)], PAGE, model.device)
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


def bench_decode(b: Bench) -> None:
    a = b.args
    decode = bench_batched_decode(b.model, a.decode_ctx, a.decode_reps)
    base = decode[0][1]
    print(f"decode: one batched decode step (context ~{a.decode_ctx}):")
    for n, tps in decode:
        print(f"  batch {n:2d}: {tps:7.1f} tok/s  ({tps / base:.2f}x batch 1)")
    e2e = []
    prompts = [f"Write a short poem about the number {i}." for i in range(8)]
    if b.smol.tokenizer is None:  # a model without a tokenizer: token-id prompts
        prompts = b.prompts(8, 12)  # type: ignore[assignment]
    for batch in (1, 8):
        e = b.engine(capacity_blocks=None, kv_memory="256MiB")
        t = time.perf_counter()
        res = e.generate(prompts[:batch], a.decode_new, ignore_eos=True)
        e2e.append((batch, sum(len(r.token_ids) for r in res) / (time.perf_counter() - t)))
    print(f"  end to end, {a.decode_new} new tokens each:")
    for n, tps in e2e:
        print(f"  batch {n}: {tps:.1f} tok/s ({tps / e2e[0][1]:.2f}x)")
    b.data["decode"] = {
        "context": a.decode_ctx,
        "step_tok_s": {str(n): tps for n, tps in decode},
        "engine_new_tokens": a.decode_new,
        "engine_tok_s": {str(n): tps for n, tps in e2e},
    }
    rows = [[f"batch {n} (context ~{a.decode_ctx})", f"{tps:.1f}", f"{tps / base:.2f}x"] for n, tps in decode]
    rows += [[f"engine end to end, batch {n}", f"{tps:.1f}", f"{tps / e2e[0][1]:.2f}x"] for n, tps in e2e]
    b.table(["decode step", "tokens/s", "vs batch 1"], rows, "Batched decode.")


# ---------------------------------------------------------------------------------------------- prefill


def prefill_run(b: Bench, prompts: list[list[int]], config: SchedulerConfig) -> tuple[float, int]:
    """(wall seconds from the submit to the last result, forward passes) for prompts submitted together."""
    pages = sum(len(p) // PAGE + 2 for p in prompts)
    e = b.engine(capacity_blocks=pages, scheduler_config=config)
    t = time.perf_counter()
    # One call queues them all before the loop's next step (Engine.submit queues them one by one, and the loop
    # thread may start a pass before the last has arrived).
    handles = e.submit_group(prompts, 1)
    results = [h.result() for h in handles]
    wall = time.perf_counter() - t
    assert all(r.cached_tokens == 0 and r.prefill_tokens == len(p) for r, p in zip(results, prompts, strict=True))
    return wall, e.runner.passes


def bench_prefill(b: Bench) -> None:
    a = b.args
    n = a.prefill_requests
    rows, data = [], []
    print(f"prefill: {n} distinct prompts submitted together, max_new_tokens=1, best of {a.reps}")
    for length in ints(a.prefill_lens):
        configs = {
            "A": SchedulerConfig(max_prefill_seqs=1, max_prefill_tokens=length, prefill_chunk=length),
            "B": SchedulerConfig(max_prefill_seqs=n, max_prefill_tokens=n * length, prefill_chunk=length),
        }
        prompts = b.prompts(n, length)
        for config in configs.values():  # warm-up
            prefill_run(b, prompts, config)
        best = dict.fromkeys(configs, float("inf"))
        npass = dict.fromkeys(configs, 0)
        for _ in range(a.reps):  # interleaved, so that a noisy moment hits both
            for name, config in configs.items():
                wall, npass[name] = prefill_run(b, prompts, config)
                best[name] = min(best[name], wall)
        tps = {name: n * length / best[name] for name in configs}
        ratio = tps["B"] / tps["A"]
        print(
            f"  {n} x {length} tokens: A one per pass {tps['A']:8.1f} tok/s ({passes(npass['A'])}, "
            f"{best['A']:.3f}s)  B {n} per pass {tps['B']:8.1f} tok/s ({passes(npass['B'])}, {best['B']:.3f}s)  "
            f"B/A {ratio:.2f}x",
            flush=True,
        )
        data.append(
            {
                "requests": n,
                "prompt_tokens": length,
                "a_tok_s": tps["A"],
                "b_tok_s": tps["B"],
                "a_wall": best["A"],
                "b_wall": best["B"],
                "a_passes": npass["A"],
                "b_passes": npass["B"],
                "ratio": ratio,
            }
        )
        rows.append(
            [
                f"{n} x {length}",
                f"{tps['A']:.1f} ({passes(npass['A'])})",
                f"{tps['B']:.1f} ({passes(npass['B'])})",
                f"{ratio:.2f}x",
            ]
        )
    b.data["prefill"] = data
    b.table(
        ["prompts", "A: 1 per pass, tok/s", f"B: {n} per pass, tok/s", "B/A"],
        rows,
        f"Batched prefill: distinct prompts, nothing cached, max_new_tokens=1, best of {a.reps} (target B/A >= 1.5x "
        "for 512 tokens).",
    )


# ---------------------------------------------------------------------------------------------- stall


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
    print(
        f"burst: {n} requests, {a.burst_shared} shared + {a.burst_tail} own tokens, {a.burst_gap}s apart, "
        f"{a.burst_new} new tokens"
    )
    shared = b.prompts(1, a.burst_shared)[0]
    prompts = b.prompts(n, a.burst_tail, prefix=shared)
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


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(MEASUREMENTS), help=f"comma-separated: {', '.join(MEASUREMENTS)}")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--model", default="smollm2", help="smollm2, a GGUF file or a Hugging Face directory")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--kv-blocks", type=int, default=256, help="sessions: KV pool pages of 16 tokens")
    ap.add_argument("--skip-sequential", action="store_true", help="sessions: skip the sequential set-ups")
    for name, (full, _) in SIZES.items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(full), default=None, help=f"default {full}")
    ap.add_argument("--markdown", default=None, help="also write the tables to this file")
    ap.add_argument("--json", default=None, help="also write every figure to this file")
    args = ap.parse_args()
    for name, (full, quick) in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    only = [m.strip() for m in args.only.split(",") if m.strip()]
    unknown = sorted(set(only) - set(MEASUREMENTS))
    if unknown or not only:
        ap.error(f"--only: unknown {unknown or 'empty list'}; choose from {', '.join(MEASUREMENTS)}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    t = time.perf_counter()
    smol = load_model(args.model, device=args.device)
    model = LlamaModel(smol.config, smol.weights, device=args.device)
    threads = torch.get_num_threads()
    name = smol.config.name
    print(f"{name} loaded in {time.perf_counter() - t:.1f}s on {args.device}, torch threads {threads}")
    b = Bench(args, smol, model)
    b.engine().generate(b.prompts(1, 8)[0], 2)  # warm up
    b.lines = [
        f"{name}, {args.device} ({platform.processor() or platform.machine()}, {threads} threads)"
        + (", --quick sizes" if args.quick else "")
        + ".",
        "",
    ]
    benches = {"sessions": bench_sessions, "decode": bench_decode, "prefill": bench_prefill}
    benches |= {"stall": bench_stall, "burst": bench_burst}
    for m in MEASUREMENTS:
        if m in only:
            t = time.perf_counter()
            benches[m](b)
            print(f"  ({m}: {time.perf_counter() - t:.1f}s)", flush=True)
    text = "\n".join(b.lines).rstrip()
    print()
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if args.json:
        meta = {"model": name, "device": args.device, "threads": threads, "quick": args.quick}
        meta |= {k: getattr(args, k) for k in SIZES}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"config": meta, **b.data}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
