"""bench_runtime.py's decode phases: batch 1 and batch 8 through the Engine, each against the raw decode step
and the baselines in the same rounds (the method is in bench_runtime.py's docstring)."""

from __future__ import annotations

import gc

import torch
from bench_runtime_contenders import HF, RAW_STEPS_B1, RAW_STEPS_B8, LlamaCpp, Ours, RawStep
from bench_runtime_report import (
    BOUND_SHARE,
    DECODE_B1_TARGET,
    DECODE_B8_TARGET,
    GGUF_VS_LLAMA_CPP,
    HF_FACTOR,
    LLAMA_CPP_FACTOR,
    fmt_ratio,
    row,
    verdict,
)
from bench_runtime_rounds import PAGE, Measure, Settings, best, bw_note, phase_bandwidth, prompt_ids, run_rounds

from radixcache.runtime import Engine
from radixcache.runtime.doctor import weight_bytes_per_token


def raw_rows(runs: dict[str, list[dict[str, float]]], tag: str, batch: int, ctx: int, bwn: str) -> None:
    """The raw-step rows of one mode: through the decode mirror (as the Engine runs) and from the pages."""
    for suffix, how in (("", "decode mirror, as the Engine"), (", pages", "pages, no mirror")):
        tps = batch * 1000 / best(runs[f"ours {tag} raw step{suffix}"], "ms/step")
        row(
            f"raw decode step, batch {batch}, context {ctx}, ours {tag}, {how}",
            f"{tps:.1f} tok/s",
            "",
            f"{batch * 1000 / tps:.1f} ms/step; {bwn}",
            tps=tps,
        )


def engine_batch8(engine: Engine, prompts: list[list[int]], s: Settings) -> dict[str, float]:
    """One batch-8 run through the engine whose tree holds the prompts (see the module docstring)."""
    steps = engine.stats.steps
    res = engine.generate(prompts, s.decode_tokens, ignore_eos=True)
    steps = engine.stats.steps - steps
    window = max(r.latency_s for r in res) - max(r.ttft_s for r in res)
    # Exact when one step prefilled all 8: the run then took decode_tokens steps. The requests are submitted
    # one by one, so the loop may start before the last arrives; with `extra` more steps, each request made at
    # most `extra` of its tokens before the window: leaving those out gives a lower bound.
    extra = max(0, steps - s.decode_tokens)
    agg = (sum(len(r.token_ids) - 1 for r in res) - len(res) * extra) / window
    return {
        "tok/s": agg,
        "steps": steps,
        "prefill tokens each": sum(r.prefill_tokens for r in res) / len(res),
        "ms first-token spread": (max(r.ttft_s for r in res) - min(r.ttft_s for r in res)) * 1000,
    }


def hf_decode_row(runs: list[dict[str, float]], batch: int, metric: str, s: Settings, bwn: str) -> float | None:
    """The row of transformers' decode tok/s at `batch`: fastest generate(n) minus fastest generate(1), both over
    the same rounds. Returns the tok/s, or None (and says so in the row) where machine noise exceeded the decode
    time, so the difference says nothing (more --reps)."""
    n = s.decode_tokens
    first = best(runs, "ms generate(1)") / 1000
    full = best(runs, f"ms generate({n})") / 1000
    tps = batch * (n - 1) / (full - first) if full > first else None
    shown = f"{tps:.1f} tok/s" if tps else "not measurable (noise > decode time)"
    row(metric, "", shown, f"generate({n}) - generate(1), each the fastest of its rounds; {bwn}", tps=tps)
    return tps


def bench_decode1(ours: list[Ours], hf: HF | None, lc: LlamaCpp | None, s: Settings, vocab: int) -> None:
    """Decode at batch 1 after the prompt, interleaved: per mode the raw step and the Engine, then transformers
    and llama.cpp."""
    ctx = s.prompt + 1
    per_seq = -(-(s.prompt + s.decode_tokens) // PAGE)
    ids = prompt_ids(s.prompt, vocab, 1)
    contenders: dict[str, Measure] = {}
    for o in ours:
        raw, paged = RawStep(o.model, 1, ctx), RawStep(o.model, 1, ctx, mirror=False)
        # Cache off: every run prefills the whole prompt, then decodes; decode_tps leaves the prefill out.
        engine = Engine(o.model, capacity_blocks=per_seq + 4, page_size=PAGE, enable_cache=False, threads=s.threads)
        contenders[f"ours {o.tag} raw step"] = lambda raw=raw: raw.step_ms(RAW_STEPS_B1)
        contenders[f"ours {o.tag} raw step, pages"] = lambda raw=paged: raw.step_ms(RAW_STEPS_B1)
        contenders[f"ours {o.tag} Engine"] = lambda engine=engine: {
            "tok/s": engine.generate(ids, s.decode_tokens, ignore_eos=True).decode_tps,
            "threads": engine.stats.threads,  # the default thread policy (adaptive): what it ran on at the end
        }
    if hf:
        hf_ids = torch.tensor([ids])
        contenders["transformers"] = lambda: hf.generate_ms(hf_ids, s.decode_tokens)
    if lc:
        new = prompt_ids(s.decode_tokens, vocab, 7)  # fixed tokens: the count is exact, no sampling or EOS
        contenders["llama.cpp"] = lambda: lc.decode_tps(ids, new)
    phase = f"decode batch 1, {s.prompt}-token prompt"
    runs = run_rounds(phase, s, contenders)
    contenders.clear()  # the engines go (their loop threads have exited: no request is in flight)
    bwn = bw_note(phase)
    hf1: float | None = None
    lc1: float | None = None
    if hf:
        hf1 = hf_decode_row(runs["transformers"], 1, f"decode, batch 1 ({s.prompt}-token prompt): {hf.label}", s, bwn)
    if lc:
        lc1 = best(runs["llama.cpp"], "tok/s", max)
        row(
            f"decode, batch 1 ({s.prompt}-token prompt): {lc.label}",
            "",
            f"{lc1:.1f} tok/s",
            f"{s.decode_tokens} tokens; {bwn}",
            tps=lc1,
        )
    for o in ours:
        raw_rows(runs, o.tag, 1, ctx, bwn)
    for o in ours:
        raw1 = 1000 / best(runs[f"ours {o.tag} raw step"], "ms/step")
        tps1 = best(runs[f"ours {o.tag} Engine"], "tok/s", max)
        note = f"{s.decode_tokens} new tokens; engine at {100 * tps1 / raw1:.0f}% of the raw step"
        if o.tag == "fp32":
            note += f"; target >= {DECODE_B1_TARGET:.0f} tok/s: {verdict(tps1 >= DECODE_B1_TARGET)}"
        note += "; " + fmt_ratio(tps1, hf1, "transformers")
        note += "; " + fmt_ratio(tps1, lc1, "llama.cpp")
        note += f"; {bwn}"
        bases = "; ".join(f"{k} {v:.1f} tok/s" for k, v in (("transformers", hf1), ("llama.cpp", lc1)) if v)
        row(
            f"decode, batch 1 ({s.prompt}-token prompt), Engine, ours {o.tag}",
            f"{tps1:.1f} tok/s",
            bases,
            note,
            tps=tps1,
            raw_tps=raw1,
            hf_tps=hf1,
            lc_tps=lc1,
        )
    issue33_rows(runs, ours, hf1, lc1, phase, bwn)
    compressed = {o.tag: best(runs[f"ours {o.tag} Engine"], "tok/s", max) for o in ours if o.tag != "fp32"}
    if lc1 and compressed:  # the stretch target asks for one compressed-weight mode: the fastest one answers it
        tag, tps = max(compressed.items(), key=lambda kv: kv[1])
        need = lc1 / LLAMA_CPP_FACTOR
        others = "; ".join(f"{t} {v:.1f} tok/s" for t, v in compressed.items() if t != tag)
        row(
            f"stretch: decode, batch 1, best compressed-weight mode (of {', '.join(compressed)}) vs llama.cpp",
            f"{tag} {tps:.1f} tok/s",
            f"llama.cpp {lc1:.1f} tok/s",
            (f"{lc1 / tps:.2f}x slower than llama.cpp" if tps < lc1 else f"{tps / lc1:.2f}x llama.cpp's speed")
            + f"; target >= llama.cpp / {LLAMA_CPP_FACTOR} = {need:.1f} tok/s: "
            f"{verdict(tps >= need)}" + (f"; {others}" if others else ""),
            mode=tag,
            tps=tps,
            lc_tps=lc1,
        )
    gc.collect()


def bench_decode1_long(ours: list[Ours], lc: LlamaCpp | None, s: Settings, vocab: int) -> None:
    """Decode at batch 1 after a long prompt (`s.long_prompt` tokens), interleaved: per mode the Engine, then
    llama.cpp on the same file."""
    n = s.long_prompt
    per_seq = -(-(n + s.decode_tokens) // PAGE)
    ids = prompt_ids(n, vocab, 3)
    contenders: dict[str, Measure] = {}
    for o in ours:
        engine = Engine(o.model, capacity_blocks=per_seq + 4, page_size=PAGE, enable_cache=False, threads=s.threads)
        contenders[f"ours {o.tag} Engine"] = lambda engine=engine: {
            "tok/s": engine.generate(ids, s.decode_tokens, ignore_eos=True).decode_tps
        }
    if lc:
        new = prompt_ids(s.decode_tokens, vocab, 7)
        contenders["llama.cpp"] = lambda: lc.decode_tps(ids, new)
    phase = f"decode batch 1, {n}-token prompt"
    runs = run_rounds(phase, s, contenders)
    contenders.clear()
    bwn = bw_note(phase)
    lc1 = best(runs["llama.cpp"], "tok/s", max) if lc else None
    if lc and lc1:
        row(
            f"decode, batch 1 ({n}-token prompt): {lc.label}",
            "",
            f"{lc1:.1f} tok/s",
            f"{s.decode_tokens} tokens; {bwn}",
        )
    for o in ours:
        tps = best(runs[f"ours {o.tag} Engine"], "tok/s", max)
        row(
            f"decode, batch 1 ({n}-token prompt), Engine, ours {o.tag}",
            f"{tps:.1f} tok/s",
            f"llama.cpp {lc1:.1f} tok/s" if lc1 else "",
            f"{s.decode_tokens} new tokens; {fmt_ratio(tps, lc1, 'llama.cpp')}; {bwn}",
            tps=tps,
            lc_tps=lc1,
        )
    gc.collect()


def issue33_rows(
    runs: dict[str, list[dict[str, float]]],
    ours: list[Ours],
    hf1: float | None,
    lc1: float | None,
    phase: str,
    bwn: str,
) -> None:
    """Issue 33's idle batch-1 acceptance rows: fp32 against transformers (best rounds) and against the bandwidth
    bound (per round: that round's read bandwidth over the bytes of weights a step reads, runtime.doctor's
    weight_bytes_per_token; the verdict on the median of the rounds' shares), gguf against llama.cpp."""
    by_tag = {o.tag: o for o in ours}
    if "fp32" in by_tag:
        engine = runs["ours fp32 Engine"]
        tps = best(engine, "tok/s", max)
        if hf1:
            ok = tps >= HF_FACTOR * hf1
            row(
                "issue 33: decode batch 1, idle, fp32 Engine vs transformers",
                f"{tps:.1f} tok/s",
                f"transformers {hf1:.1f} tok/s",
                f"{tps / hf1:.2f}x; target >= {HF_FACTOR}x: {verdict(ok)}; {bwn}",
                tps=tps,
                hf_tps=hf1,
            )
        nbytes = weight_bytes_per_token(by_tag["fp32"].model)
        shares = [r["tok/s"] * nbytes / (bw * 1e9) for r, bw in zip(engine, phase_bandwidth(phase), strict=True)]
        share = sorted(shares)[len(shares) // 2]
        bounds = [bw * 1e9 / nbytes for bw in phase_bandwidth(phase)]
        row(
            "issue 33: decode batch 1, idle, fp32 Engine vs the bandwidth bound",
            f"{share:.0%} of the bound (median of rounds)",
            f"bound {min(bounds):.1f}-{max(bounds):.1f} tok/s ({nbytes / 1e6:.0f} MB of weights a token)",
            f"rounds {', '.join(f'{x:.0%}' for x in shares)}; target >= {BOUND_SHARE:.0%}: "
            f"{verdict(share >= BOUND_SHARE)}; threads at the end {sorted({int(r['threads']) for r in engine})}; {bwn}",
            share=share,
            shares=shares,
            bounds=bounds,
            weight_bytes=nbytes,
        )
    if "gguf" in by_tag and lc1:
        tps = best(runs["ours gguf Engine"], "tok/s", max)
        row(
            "issue 33: decode batch 1, idle, gguf Engine vs llama.cpp (same file, same threads)",
            f"{tps:.1f} tok/s",
            f"llama.cpp {lc1:.1f} tok/s",
            f"{tps / lc1:.2f}x; target >= {GGUF_VS_LLAMA_CPP}x: {verdict(tps >= GGUF_VS_LLAMA_CPP * lc1)}; {bwn}",
            tps=tps,
            lc_tps=lc1,
        )


def bench_decode8(ours: list[Ours], hf: HF | None, s: Settings, vocab: int) -> None:
    """Decode at batch 8, aggregate, interleaved: per mode the raw step and the Engine (cache on, prompts in the
    tree), then transformers with --hf-batch8."""
    ctx = s.prompt + 1
    per_seq = -(-(s.prompt + s.decode_tokens) // PAGE)
    prompts = [prompt_ids(s.prompt, vocab, 200 + i) for i in range(8)]
    contenders: dict[str, Measure] = {}
    for o in ours:
        raw, paged = RawStep(o.model, 8, ctx), RawStep(o.model, 8, ctx, mirror=False)
        engine = Engine(o.model, capacity_blocks=2 * 8 * per_seq + 16, page_size=PAGE, threads=s.threads)
        engine.generate(prompts, 1, ignore_eos=True)  # their KV goes into the tree
        contenders[f"ours {o.tag} raw step"] = lambda raw=raw: raw.step_ms(RAW_STEPS_B8)
        contenders[f"ours {o.tag} raw step, pages"] = lambda raw=paged: raw.step_ms(RAW_STEPS_B8)
        contenders[f"ours {o.tag} Engine"] = lambda engine=engine: engine_batch8(engine, prompts, s)
    if hf and s.hf_batch8:
        hf_ids = torch.tensor([prompt_ids(s.prompt, vocab, 1 + i) for i in range(8)])
        contenders["transformers"] = lambda: hf.generate_ms(hf_ids, s.decode_tokens)
    phase = f"decode batch 8, {s.prompt}-token prompts"
    runs = run_rounds(phase, s, contenders)
    contenders.clear()
    bwn = bw_note(phase)
    hf8 = None
    if hf and s.hf_batch8:
        hf8 = hf_decode_row(runs["transformers"], 8, f"decode, batch 8 aggregate: {hf.label}", s, bwn)
    for o in ours:
        raw_rows(runs, o.tag, 8, ctx, bwn)
    for o in ours:
        raw8 = 8000 / best(runs[f"ours {o.tag} raw step"], "ms/step")
        top = max(runs[f"ours {o.tag} Engine"], key=lambda r: r["tok/s"])
        agg, steps = top["tok/s"], int(top["steps"])
        exact = steps == s.decode_tokens
        note = (
            f"{s.decode_tokens} new tokens each; prefill {top['prefill tokens each']:.0f} of {s.prompt} tokens each "
            f"(cached), first tokens within {top['ms first-token spread']:.0f} ms; {steps} engine steps"
            + ("" if exact else f" (not {s.decode_tokens}: prefills spread over steps, a lower bound)")
            + f"; engine at {100 * agg / raw8:.0f}% of the raw step"
        )
        if o.tag == "fp32":
            note += f"; target >= {DECODE_B8_TARGET:.0f} tok/s: {verdict(agg >= DECODE_B8_TARGET)}"
        if hf8:
            note += "; " + fmt_ratio(agg, hf8, "transformers")
        note += f"; {bwn}"
        row(
            f"decode, batch 8 aggregate ({s.prompt}-token prompts), Engine, ours {o.tag}",
            f"{agg:.1f} tok/s",
            f"transformers {hf8:.1f} tok/s" if hf8 else "",
            note,
            tps=agg,
            raw_tps=raw8,
            hf_tps=hf8,
            engine_steps=steps,
            exact_window=exact,
        )
    gc.collect()
