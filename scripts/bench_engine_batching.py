"""bench_engine.py's batching measurements: batched decode (the step at batch 1, 8, 16, and the engine end to end)
and batched prefill (one request per pass against all of them in one pass)."""

from __future__ import annotations

import time

import torch
from bench_engine_kit import PAGE, Bench, ints, passes

from radixcache.runtime.engine.scheduler import SchedulerConfig
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel


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
