"""Benchmark the runtime on SmolLM2 on this CPU, with every baseline measured in the same run (issue 8).

    .venv/bin/python scripts/bench_runtime.py                      # everything (several minutes on 2 cores)
    .venv/bin/python scripts/bench_runtime.py --quick              # smoke run: short prompts, few tokens
    .venv/bin/python scripts/bench_runtime.py --quant none         # fp32 only (default: none,fp16)
    .venv/bin/python scripts/bench_runtime.py --no-hf --no-llama-cpp --threads 2 --json bench.json

Measured, for each `--quant` mode of ours (fp32 weights, fp16 weights):
- prefill tokens/s at 128, 512 and 2048 prompt tokens: ours is `model.prefill` (cache off, chunks of 512);
  transformers is one forward of the whole prompt (`use_cache=False`, `logits_to_keep=1`: like ours it computes
  the last position's logits only); llama.cpp is `Llama.eval` of the prompt (n_batch 512).
  Target (fp32): ours >= transformers at every length.
- decode at batch 1 after a 512-token prompt, through the Engine (its loop thread, the real serving path): one
  request, 64 new tokens with ignore_eos, `GenerationResult.decode_tps` (tokens after the first / time after
  the first), best of `--reps` after a warm-up. Target (fp32): >= 25 tok/s.
- decode at batch 8, aggregate, through the Engine with the cache on: the 8 distinct 512-token prompts first run
  with max_new_tokens=1 so that their KV is in the tree; then all 8 are submitted at once, so each prefill is
  only the page-unaligned tail of its prompt. The scheduler prefills all 8 in one step (8 short prefills fit
  its per-step budget) and then decodes them together; each emits its first token in that step and they all
  finish in the same step. So the window from the last first token (max ttft_s) to the last finish (max
  latency_s) holds exactly the batch-8 decode steps, and aggregate tok/s = sum(generated - 1) / (max latency_s
  - max ttft_s): prefill is excluded as it is for batch 1. The engine's step counter checks the premise (the
  run takes exactly 64 steps); when the loop started before all 8 arrived and the prefills took k extra steps,
  8 * k tokens are left out, which makes the figure a lower bound (the row says so). Best of `--reps`.
  Target (fp32): >= 100 tok/s.
- the raw decode step (`model.decode` on this thread, no engine) at batch 1 and 8, context 513, so that the
  engine's overhead is visible (engine tok/s as a percentage of the raw step's).
- transformers decode at batch 1 after a 512-token prompt: `generate` of n tokens minus `generate` of 1 token
  (same prompt, greedy), so the prefill cancels out; with `--hf-batch8` also at batch 8.
- llama.cpp (llama-cpp-python, optional): decode at batch 1 after a 512-token prompt, `Llama.eval([tok])` one
  token at a time for 64 tokens (the exact count), `reset()` between runs. It runs the GGUF file as stored
  (SmolLM2's file is Q4_1), so it reads fewer weight bytes than any of our modes.
  Stretch target: a compressed-weight mode (fp16 here) decodes at batch 1 at >= llama.cpp / 1.5.
- TTFT of a 2,000-token prompt whose first 1,800 tokens are cached, against the same prompt with the cache
  off (target: speedup >= 0.8 x prompt tokens / computed tokens), fp32.
- one paged decode step against one contiguous-KV decode step with the same model (target: <= 1.2x), fp32.

Every timing is the fastest of its repetitions after a warm-up: on a shared machine noise only adds time.
Prints each result as it comes, then one markdown table; `--json PATH` writes every row with its numbers.
transformers and llama-cpp-python are benchmark-only dependencies: each is skipped with a message if missing.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# First: runtime sets libgomp's spin defaults, which only take effect if torch is not loaded yet.
import runtime  # noqa: F401

# isort: split

import argparse
import contextlib
import gc
import io
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from runtime import Engine
from runtime.attention import build_decode_meta
from runtime.kv_pool import KVPool
from runtime.loading import load_model
from runtime.model import LlamaModel

PAGE = 16
DECODE_B1_TARGET = 25.0  # tok/s, fp32
DECODE_B8_TARGET = 100.0  # tok/s aggregate, fp32
LLAMA_CPP_FACTOR = 1.5  # fp16-weight decode within 1.5x of llama.cpp (the stretch target)


@dataclass
class Row:
    metric: str
    ours: str
    base: str
    note: str
    data: dict[str, Any] = field(default_factory=dict)


ROWS: list[Row] = []


def row(metric: str, ours: str, base: str = "", note: str = "", **data: Any) -> None:
    ROWS.append(Row(metric, ours, base, note, data))
    print(f"  {metric}: {ours}  {base}  {note}", flush=True)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


@dataclass(frozen=True)
class Settings:
    threads: int
    reps: int
    decode_tokens: int
    prompt: int  # prompt length before decode ("after a 512-token prompt")
    prefill_lens: tuple[int, ...]
    ttft_total: int
    ttft_cached: int
    ttft_rounds: int
    paged_ctx: tuple[int, ...]
    hf_batch8: bool


@dataclass
class Baselines:
    """Baseline tok/s keyed by measurement; None where not measured."""

    hf_prefill: dict[int, float] = field(default_factory=dict)
    hf_decode1: float | None = None
    hf_decode8: float | None = None
    lc_prefill: dict[int, float] = field(default_factory=dict)
    lc_decode1: float | None = None


def timed(fn: Callable[[], object], reps: int) -> float:
    """Fastest of `reps` calls after one warm-up call: on a shared machine the minimum is the stable estimate of
    the cost itself (noise only ever adds time)."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def prompt_ids(n: int, vocab: int, seed: int) -> list[int]:
    # Real text would do as well; random ids in the ordinary-word range keep the lengths exact.
    return torch.randint(1000, min(vocab, 30000), (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fmt_ratio(ours: float, base: float | None, name: str) -> str:
    return f"{ours / base:.2f}x {name}" if base else f"{name} n/a"


# ---------------------------------------------------------------------- baselines


def bench_llama_cpp(path: str, s: Settings, base: Baselines) -> None:
    try:
        import llama_cpp
    except ImportError as exc:
        msg = f"llama-cpp-python is not importable ({exc}): .venv/bin/pip install llama-cpp-python"
        print(f"  SKIPPED llama.cpp: {msg}")
        row("llama.cpp", "not measured", "", msg)
        return
    llm = llama_cpp.Llama(
        model_path=path,
        n_ctx=4096,
        n_threads=s.threads,
        n_threads_batch=s.threads,
        n_batch=512,
        verbose=False,
        logits_all=False,
    )
    vocab = llm.n_vocab()
    name = f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, {os.path.basename(path)})"
    for n in s.prefill_lens:
        ids = prompt_ids(n, vocab, n)

        def prefill(ids: list[int] = ids) -> None:
            llm.reset()  # n_tokens = 0: the next eval overwrites the KV from position 0
            llm.eval(ids)

        sec = timed(prefill, s.reps if n < 2048 else max(1, s.reps // 2))
        base.lc_prefill[n] = n / sec
        row(f"prefill {n} tokens: {name}", "", f"{n / sec:,.0f} tok/s", f"{sec * 1000:,.0f} ms", tps=n / sec)

    prompt = prompt_ids(s.prompt, vocab, 1)
    new = prompt_ids(s.decode_tokens, vocab, 7)  # fixed tokens: the count is exact, no sampling or EOS

    def decode() -> float:
        llm.reset()
        llm.eval(prompt)
        t = time.perf_counter()
        for tok in new:
            llm.eval([tok])
        return time.perf_counter() - t

    decode()  # warm-up
    sec = min(decode() for _ in range(s.reps))
    base.lc_decode1 = s.decode_tokens / sec
    row(
        f"decode, batch 1 ({s.prompt}-token prompt): {name}",
        "",
        f"{base.lc_decode1:.1f} tok/s",
        f"{s.decode_tokens} tokens",
        tps=base.lc_decode1,
    )


def bench_hf(path: str, s: Settings, base: Baselines) -> None:
    try:
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        msg = "transformers is not installed: .venv/bin/pip install transformers gguf accelerate"
        print(f"  SKIPPED the transformers comparison: {msg}")
        row("transformers", "not measured", "", msg)
        return
    folder, name = os.path.split(path)
    with contextlib.redirect_stderr(io.StringIO()):  # its GGUF conversion progress bars would swamp the output
        hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    hf.eval()
    vocab = hf.config.vocab_size
    label = f"transformers {transformers.__version__} fp32"
    with torch.inference_mode():
        for n in s.prefill_lens:
            ids = torch.tensor([prompt_ids(n, vocab, n)])
            # The prompt's forward pass producing the last logits, as ours does: no KV cache kept, no sampling.
            sec = timed(
                lambda ids=ids: hf(input_ids=ids, use_cache=False, logits_to_keep=1),
                s.reps if n < 2048 else max(1, s.reps // 2),
            )
            base.hf_prefill[n] = n / sec
            row(f"prefill {n} tokens: {label}", "", f"{n / sec:,.0f} tok/s", f"{sec * 1000:,.0f} ms", tps=n / sec)

        def gen_tps(batch: int, reps: int) -> float | None:
            ids = torch.tensor([prompt_ids(s.prompt, vocab, 1 + i) for i in range(batch)])
            mask = torch.ones_like(ids)

            def gen(n: int) -> None:
                hf.generate(
                    ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
                )

            gen(2)  # warm-up
            first = timed(lambda: gen(1), reps)
            full = timed(lambda: gen(s.decode_tokens), reps)
            # None: machine noise exceeded the decode time, so the difference says nothing (more --reps).
            return batch * (s.decode_tokens - 1) / (full - first) if full > first else None

        def show(tps: float | None) -> str:
            return f"{tps:.1f} tok/s" if tps else "not measurable (noise > decode time)"

        note = f"generate({s.decode_tokens}) - generate(1)"
        base.hf_decode1 = gen_tps(1, s.reps)
        row(f"decode, batch 1 ({s.prompt}-token prompt): {label}", "", show(base.hf_decode1), note)
        if s.hf_batch8:
            base.hf_decode8 = gen_tps(8, max(1, s.reps // 2))
            row(f"decode, batch 8 aggregate: {label}", "", show(base.hf_decode8), note)


# ---------------------------------------------------------------------- ours


def bench_prefill(model: LlamaModel, tag: str, s: Settings, base: Baselines) -> None:
    pool = model.new_pool(max(s.prefill_lens) // PAGE + 1, PAGE)
    table = list(range(pool.num_blocks))
    for n in s.prefill_lens:
        ids = prompt_ids(n, model.config.vocab_size, n)
        with torch.inference_mode():
            sec = timed(lambda ids=ids: model.prefill(ids, 0, table, pool), s.reps if n < 2048 else max(1, s.reps // 2))
        tps = n / sec
        hf = base.hf_prefill.get(n)
        lc = base.lc_prefill.get(n)
        note = f"{sec * 1000:,.0f} ms; " + fmt_ratio(tps, hf, "transformers")
        if hf and tag == "fp32":
            note += f", target >= 1.0x: {verdict(tps >= hf)}"
        note += "; " + fmt_ratio(tps, lc, "llama.cpp")
        bases = "; ".join(f"{k} {v:,.0f} tok/s" for k, v in (("transformers", hf), ("llama.cpp", lc)) if v is not None)
        row(f"prefill {n} tokens, ours {tag}", f"{tps:,.0f} tok/s", bases, note, tps=tps, hf_tps=hf, lc_tps=lc)


def raw_decode_tps(model: LlamaModel, batch: int, ctx: int, reps: int) -> float:
    """Tokens/s of `model.decode` on this thread: `batch` sequences at context `ctx` (the new token included)."""
    n_pages = -(-ctx // PAGE)
    pool = model.new_pool(batch * n_pages, PAGE)
    tables = [list(range(b * n_pages, (b + 1) * n_pages)) for b in range(batch)]
    vocab = model.config.vocab_size
    with torch.inference_mode():
        for b in range(batch):
            model.prefill(prompt_ids(ctx - 1, vocab, 100 + b), 0, tables[b], pool)
        meta = build_decode_meta(tables, [ctx] * batch, PAGE, model.device)
        toks = prompt_ids(batch, vocab, 9)
        sec = timed(lambda: model.decode(toks, meta, pool), reps)  # rewrites the same slot each time
    return batch / sec


def bench_decode(model: LlamaModel, tag: str, s: Settings, base: Baselines) -> dict[str, float]:
    vocab = model.config.vocab_size
    ctx = s.prompt + 1
    raw1 = raw_decode_tps(model, 1, ctx, s.reps * 5)
    raw8 = raw_decode_tps(model, 8, ctx, s.reps * 3)
    row(f"raw decode step, batch 1, context {ctx}, ours {tag}", f"{raw1:.1f} tok/s", "", f"{1000 / raw1:.1f} ms/step")
    row(
        f"raw decode step, batch 8, context {ctx}, ours {tag}",
        f"{raw8:.1f} tok/s",
        "",
        f"{8000 / raw8:.1f} ms/step",
    )

    # Batch 1 through the engine, cache off: every run prefills the whole prompt, then decodes.
    per_seq = -(-(s.prompt + s.decode_tokens) // PAGE)
    engine = Engine(model, capacity_blocks=per_seq + 4, page_size=PAGE, enable_cache=False, threads=s.threads)
    ids = prompt_ids(s.prompt, vocab, 1)
    engine.generate(ids, 4, ignore_eos=True)  # warm-up
    outs = [engine.generate(ids, s.decode_tokens, ignore_eos=True) for _ in range(s.reps)]
    tps1 = max(o.decode_tps for o in outs)
    del engine
    note = f"{s.decode_tokens} new tokens; engine at {100 * tps1 / raw1:.0f}% of the raw step"
    if tag == "fp32":
        note += f"; target >= {DECODE_B1_TARGET:.0f} tok/s: {verdict(tps1 >= DECODE_B1_TARGET)}"
    note += "; " + fmt_ratio(tps1, base.hf_decode1, "transformers")
    note += "; " + fmt_ratio(tps1, base.lc_decode1, "llama.cpp")
    if tag == "fp16" and base.lc_decode1:
        need = base.lc_decode1 / LLAMA_CPP_FACTOR
        note += f", stretch target >= llama.cpp / {LLAMA_CPP_FACTOR} = {need:.1f} tok/s: {verdict(tps1 >= need)}"
    bases = "; ".join(
        f"{k} {v:.1f} tok/s" for k, v in (("transformers", base.hf_decode1), ("llama.cpp", base.lc_decode1)) if v
    )
    row(
        f"decode, batch 1 ({s.prompt}-token prompt), Engine, ours {tag}",
        f"{tps1:.1f} tok/s",
        bases,
        note,
        tps=tps1,
        raw_tps=raw1,
        hf_tps=base.hf_decode1,
        lc_tps=base.lc_decode1,
    )

    # Batch 8 through the engine, cache on: prime the tree with the 8 prompts, then submit them together.
    engine = Engine(model, capacity_blocks=2 * 8 * per_seq + 16, page_size=PAGE, threads=s.threads)
    prompts = [prompt_ids(s.prompt, vocab, 200 + i) for i in range(8)]
    engine.generate(prompts, 1, ignore_eos=True)  # their KV goes into the tree
    engine.generate(prompts, 4, ignore_eos=True)  # warm-up of the batch-8 path
    best, best_res, best_steps = 0.0, None, 0
    for _ in range(s.reps):
        steps = engine.stats.steps
        res = engine.generate(prompts, s.decode_tokens, ignore_eos=True)
        steps = engine.stats.steps - steps
        window = max(r.latency_s for r in res) - max(r.ttft_s for r in res)
        # Exact when one step prefilled all 8: the run then took decode_tokens steps. The requests are submitted
        # one by one, so the loop may start before the last arrives; with `extra` more steps, each request made
        # at most `extra` of its tokens before the window: leaving those out gives a lower bound.
        extra = max(0, steps - s.decode_tokens)
        agg = (sum(len(r.token_ids) - 1 for r in res) - len(res) * extra) / window
        if agg > best:
            best, best_res, best_steps = agg, res, steps
    del engine
    assert best_res is not None
    exact = best_steps == s.decode_tokens
    computed = sum(r.prefill_tokens for r in best_res) / 8
    spread = (max(r.ttft_s for r in best_res) - min(r.ttft_s for r in best_res)) * 1000
    note = (
        f"{s.decode_tokens} new tokens each; prefill {computed:.0f} of {s.prompt} tokens each (cached), first "
        f"tokens within {spread:.0f} ms; {best_steps} engine steps"
        + ("" if exact else f" (not {s.decode_tokens}: prefills spread over steps, a lower bound)")
        + f"; engine at {100 * best / raw8:.0f}% of the raw step"
    )
    if tag == "fp32":
        note += f"; target >= {DECODE_B8_TARGET:.0f} tok/s: {verdict(best >= DECODE_B8_TARGET)}"
    if base.hf_decode8:
        note += "; " + fmt_ratio(best, base.hf_decode8, "transformers")
    row(
        f"decode, batch 8 aggregate ({s.prompt}-token prompts), Engine, ours {tag}",
        f"{best:.1f} tok/s",
        f"transformers {base.hf_decode8:.1f} tok/s" if base.hf_decode8 else "",
        note,
        tps=best,
        raw_tps=raw8,
        hf_tps=base.hf_decode8,
        engine_steps=best_steps,
        exact_window=exact,
    )
    return {"decode1": tps1, "decode8": best}


def bench_ttft(model: LlamaModel, s: Settings) -> None:
    vocab = model.config.vocab_size
    shared = prompt_ids(s.ttft_cached, vocab, 2)
    prompt = shared + prompt_ids(s.ttft_total - s.ttft_cached, vocab, 3)
    blocks = 4 * (-(-s.ttft_total // PAGE)) + 8
    on = Engine(model, capacity_blocks=blocks, page_size=PAGE, threads=s.threads)
    off = Engine(model, capacity_blocks=blocks, page_size=PAGE, enable_cache=False, threads=s.threads)
    on.generate(prompt_ids(300, vocab, 4), 1)  # warm-up, unrelated
    off.generate(prompt_ids(300, vocab, 4), 1)
    cold, warm = [], []
    for i in range(s.ttft_rounds):
        on.generate(shared + prompt_ids(50, vocab, 10 + i), 1)  # puts the shared prefix in the tree
        warm.append(on.generate(prompt, 1))
        cold.append(off.generate(prompt, 1))
        on.cache.evict(on.cache.evictable_blocks)  # start the next round from an empty tree
    hit = min(warm, key=lambda r: r.ttft_s)
    base = min(cold, key=lambda r: r.ttft_s)
    speedup = base.ttft_s / hit.ttft_s
    ideal = hit.prompt_tokens / hit.prefill_tokens
    row(
        f"TTFT, {s.ttft_total:,} tokens, {s.ttft_cached:,} cached, fp32",
        f"{hit.ttft_s * 1000:,.0f} ms ({hit.cached_tokens} cached, {hit.prefill_tokens} computed)",
        f"cache off {base.ttft_s * 1000:,.0f} ms",
        f"speedup {speedup:.2f}x; target >= 0.8 x {ideal:.2f} = {0.8 * ideal:.2f}x: {verdict(speedup >= 0.8 * ideal)}",
        speedup=speedup,
        ideal=ideal,
        ttft_s=hit.ttft_s,
        cold_ttft_s=base.ttft_s,
    )


def contiguous_step(model: LlamaModel, pool: KVPool, token: int, length: int) -> torch.Tensor:
    """One decode step whose KV is one contiguous run (a single page as long as the sequence): no gather."""
    cfg = model.config
    kvh, g, d = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
    positions = torch.tensor([length - 1])

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kp, vp = pool.layer(layer)
        keys = kp[0, :length].transpose(0, 1).unsqueeze(0)
        vals = vp[0, :length].transpose(0, 1).unsqueeze(0)
        return F.scaled_dot_product_attention(q.view(1, kvh, g, d), keys, vals).reshape(1, -1, d)

    hidden = model._layers(torch.tensor([token]), positions, pool, positions, attend)
    return model._logits(hidden)


def decode_step_costs(model: LlamaModel, ctx: int, reps: int) -> tuple[float, float]:
    """Seconds of one decode step at context `ctx`: paged (shuffled block table) and contiguous."""
    ids = prompt_ids(ctx, model.config.vocab_size, 5)
    n_pages = -(-ctx // PAGE)
    paged = model.new_pool(n_pages * 2, PAGE)
    table = torch.randperm(n_pages * 2, generator=torch.Generator().manual_seed(0))[:n_pages].tolist()
    flat = KVPool(model.config, 1, ctx, dtype=model.dtype, device=model.device)
    with torch.inference_mode():
        model.prefill(ids[:-1], 0, table, paged)
        model.prefill(ids[:-1], 0, [0], flat)
        meta = build_decode_meta([table], [ctx], PAGE, model.device)
        a = model.decode(ids[-1:], meta, paged)
        b = contiguous_step(model, flat, ids[-1], ctx)
        assert (a - b).abs().max().item() < 1e-3
        p = c = float("inf")
        for _ in range(reps):  # interleaved, so that machine noise hits both alike
            p = min(p, timed(lambda: model.decode(ids[-1:], meta, paged), 1))
            c = min(c, timed(lambda: contiguous_step(model, flat, ids[-1], ctx), 1))
    return p, c


def bench_paged_vs_contiguous(model: LlamaModel, s: Settings) -> None:
    for ctx in s.paged_ctx:
        paged_s, flat_s = decode_step_costs(model, ctx, s.reps * 4)
        ratio = paged_s / flat_s
        row(
            f"decode step at {ctx} tokens, paged (page {PAGE}), fp32",
            f"{paged_s * 1000:.1f} ms",
            f"contiguous {flat_s * 1000:.1f} ms",
            f"{ratio:.2f}x; target <= 1.2x: {verdict(ratio <= 1.2)}",
            ratio=ratio,
        )


# ---------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quant", default="none,fp16", help="comma list of our modes: none, fp16")
    ap.add_argument("--threads", type=int, default=0, help="threads for torch, the engine and llama.cpp (0: torch's)")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    ap.add_argument("--hf-batch8", action="store_true", help="also measure transformers decode at batch 8 (slow)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp comparison")
    ap.add_argument("--reps", type=int, default=3, help="timed repetitions (the fastest counts)")
    ap.add_argument("--decode-tokens", type=int, default=64, help="new tokens per decode measurement")
    ap.add_argument("--quick", action="store_true", help="smoke run: prefill 128 only, short prompts, 8 tokens")
    ap.add_argument("--json", metavar="PATH", help="write every row, with its numbers, to this JSON file")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    modes = [m.strip() for m in args.quant.split(",") if m.strip()]
    for m in modes:
        if m not in ("none", "fp16"):
            raise SystemExit(f"--quant: unknown mode {m!r} (none, fp16)")
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    if args.quick:
        s = Settings(threads, 1, 8, 128, (128,), 400, 360, 1, (128,), args.hf_batch8)
    else:
        s = Settings(
            threads,
            args.reps,
            args.decode_tokens,
            512,
            (128, 512, 2048),
            2000,
            1800,
            3,
            (128, 1024, 2000),
            args.hf_batch8,
        )
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    header = {
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "load_average": load,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "quick": args.quick,
    }
    print(
        f"# {header['cpu']}, {os.cpu_count()} CPUs, {threads} threads, torch {torch.__version__}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, OMP_WAIT_POLICY={header['omp_wait_policy']}"
        + (" (--quick: smoke-run sizes, not the issue's)" if args.quick else ""),
        flush=True,
    )
    t = time.perf_counter()
    smol = load_model(args.model)
    print(f"  loaded {smol.config.name} from {smol.source} in {time.perf_counter() - t:.1f} s", flush=True)

    base = Baselines()
    if args.no_llama_cpp:
        row("llama.cpp", "not measured", "", "--no-llama-cpp")
    else:
        bench_llama_cpp(smol.source, s, base)
    if args.no_hf:
        row("transformers", "not measured", "", "--no-hf")
    else:
        bench_hf(smol.source, s, base)
        gc.collect()  # the transformers model goes before ours are built

    fp32_done = False
    for mode in modes:
        tag = "fp32" if mode == "none" else mode
        try:
            model = LlamaModel(smol.config, smol.weights, quant=mode)
        except ValueError as exc:
            print(f"  SKIPPED quant={mode}: {exc}")
            row(f"ours {tag}", "not measured", "", str(exc))
            continue
        print(f"## ours, {tag}", flush=True)
        bench_prefill(model, tag, s, base)
        bench_decode(model, tag, s, base)
        if mode == "none":
            bench_ttft(model, s)
            bench_paged_vs_contiguous(model, s)
            fp32_done = True
        del model
        gc.collect()
    if not fp32_done:
        print("  (TTFT and paged-vs-contiguous rows are measured with fp32 only: add none to --quant)")

    print()
    print("| metric | ours | baseline | ratio / note |")
    print("| --- | --- | --- | --- |")
    for r in ROWS:
        print(f"| {r.metric} | {r.ours} | {r.base} | {r.note} |")
    met = sum(r.note.count(": met") for r in ROWS)
    missed = [r.metric for r in ROWS if ": MISSED" in r.note]
    print(f"\ntargets: {met} met, {len(missed)} missed" + "".join(f"\n  MISSED: {m}" for m in missed))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"header": header, "rows": [asdict(r) for r in ROWS]}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
