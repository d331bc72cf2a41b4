"""bench_runtime.py's prefill phases: prefill throughput against the baselines in rounds, and the TTFT of a
prompt whose prefix is cached against the same prompt with the cache off."""

from __future__ import annotations

import gc

import torch
from bench_runtime_contenders import HF, LlamaCpp, Ours
from bench_runtime_report import fmt_ratio, row, verdict
from bench_runtime_rounds import PAGE, Measure, Settings, best, bw_note, prompt_ids, run_rounds, timed_once

from radixcache.runtime import Engine
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.model.llama import LlamaModel


def bench_prefill(ours: list[Ours], hf: HF | None, lc: LlamaCpp | None, s: Settings, vocab: int) -> None:
    """Prefill at each length, interleaved: ours (cache off, chunks of 512), transformers, llama.cpp."""
    for n in s.prefill_lens:
        prefill_at(n, ours, hf, lc, s, vocab)


def prefill_at(n: int, ours: list[Ours], hf: HF | None, lc: LlamaCpp | None, s: Settings, vocab: int) -> None:
    """The rounds at one prompt length `n`, and their rows."""
    ids = prompt_ids(n, vocab, n)
    contenders: dict[str, Measure] = {}
    for o in ours:
        pool = o.model.new_pool(n // PAGE + 1, PAGE)
        table = list(range(pool.num_blocks))

        def run(model: LlamaModel = o.model, pool: KVPool = pool, table: list[int] = table) -> dict[str, float]:
            with torch.inference_mode():
                return {"ms": timed_once(lambda: model.prefill(ids, 0, table, pool)) * 1000}

        contenders[f"ours {o.tag}"] = run
    if hf:
        hf_ids = torch.tensor([ids])
        contenders["transformers"] = lambda: hf.forward_ms(hf_ids)
    if lc:
        contenders["llama.cpp"] = lambda: lc.eval_ms(ids)
    phase = f"prefill {n}"
    runs = run_rounds(phase, s, contenders)
    bwn = bw_note(phase)
    hf_tps = n / best(runs["transformers"], "ms") * 1000 if hf else None
    lc_tps = n / best(runs["llama.cpp"], "ms") * 1000 if lc else None
    for who, tps in ((hf, hf_tps), (lc, lc_tps)):
        if who and tps:
            row(
                f"prefill {n} tokens: {who.label}",
                "",
                f"{tps:,.0f} tok/s",
                f"{n / tps * 1000:,.0f} ms; {bwn}",
                tps=tps,
            )
    for o in ours:
        sec = best(runs[f"ours {o.tag}"], "ms") / 1000
        tps = n / sec
        note = f"{sec * 1000:,.0f} ms; " + fmt_ratio(tps, hf_tps, "transformers")
        if hf_tps and o.tag == "fp32":
            note += f", target >= 1.0x: {verdict(tps >= hf_tps)}"
        note += "; " + fmt_ratio(tps, lc_tps, "llama.cpp") + f"; {bwn}"
        bases = "; ".join(
            f"{k} {v:,.0f} tok/s" for k, v in (("transformers", hf_tps), ("llama.cpp", lc_tps)) if v is not None
        )
        row(
            f"prefill {n} tokens, ours {o.tag}",
            f"{tps:,.0f} tok/s",
            bases,
            note,
            tps=tps,
            hf_tps=hf_tps,
            lc_tps=lc_tps,
        )
    gc.collect()


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
