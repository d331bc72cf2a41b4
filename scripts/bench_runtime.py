"""Benchmark the runtime on SmolLM2 on this CPU, with every baseline measured in the same run (issue 8).

    .venv/bin/python scripts/bench_runtime.py                      # everything (several minutes on 2 cores)
    .venv/bin/python scripts/bench_runtime.py --quick              # smoke run: short prompts, few tokens
    .venv/bin/python scripts/bench_runtime.py --quant none         # fp32 only (default: none,fp16,gguf)
    .venv/bin/python scripts/bench_runtime.py --no-hf --no-llama-cpp --threads 2 --json bench.json
    .venv/bin/python scripts/bench_runtime.py --only prefill,decode8  # some sections only

Interleaved rounds, and why. This 2-core VM shares its host's memory bus: the read bandwidth swings between about
28 and 55 GB/s within minutes, and every weight-streaming number moves with it. Measured one contender after the
other (llama.cpp, then transformers, then ours), baselines and ours landed in different bandwidth windows and the
ratios said nothing: one full run had ours at 0.72x transformers for a 128-token prefill, a profile of the same
two minutes later 1.44x. So everything is loaded first (transformers, llama.cpp, ours in each `--quant` mode),
and every comparison runs in rounds: in each round each contender runs once, one after the other (ours in each
mode, then transformers, then llama.cpp); one warm-up round that is not counted, then `--reps` counted rounds;
each contender's best round (least time, most tok/s) counts, and the ratios are computed from those. A slow window
then slows every contender in its round alike, and the best rounds of all contenders come from comparable windows.
The memory bandwidth is measured (a 512 MB sum) at the start of every round and printed; the JSON keeps every
round with its bandwidth and each contender's numbers ("rounds"), and each row's note gives the range in its
phase.

Measured, for each `--quant` mode of ours (fp32 weights, fp16 weights), each against the baselines in the same
rounds:
- prefill tokens/s at 128, 512 and 2048 prompt tokens: ours is `model.prefill` (cache off, chunks of 512);
  transformers is one forward of the whole prompt (`use_cache=False`, `logits_to_keep=1`: like ours it computes
  the last position's logits only); llama.cpp is `Llama.eval` of the prompt (n_batch 512) after `reset()`.
  Target (fp32): ours >= transformers at every length.
- decode at batch 1 after a 512-token prompt, through the Engine (its loop thread, the real serving path): one
  request, 64 new tokens with ignore_eos, `GenerationResult.decode_tps` (tokens after the first / time after
  the first), one run per round. Target (fp32): >= 25 tok/s.
- the raw decode step (`model.decode` on this thread, no engine) at batch 1 and 8, context 513, once through the
  decode mirror (radixcache.runtime.kv.mirror, as the Engine decodes) and once from the pages, timed in the
  same rounds as the engine runs (5 steps per round at batch 1, 3 at batch 8, after one untimed step; the
  fastest counts), so that "engine at N% of the raw step" compares numbers from the same windows.
- decode at batch 8, aggregate, through the Engine with the cache on: the 8 distinct 512-token prompts first run
  with max_new_tokens=1 so that their KV is in the tree; then all 8 are submitted at once, so each prefill is
  only the page-unaligned tail of its prompt. The scheduler prefills all 8 in one step (8 short prefills fit
  its per-step budget) and then decodes them together; each emits its first token in that step and they all
  finish in the same step. So the window from the last first token (max ttft_s) to the last finish (max
  latency_s) holds exactly the batch-8 decode steps, and aggregate tok/s = sum(generated - 1) / (max latency_s
  - max ttft_s): prefill is excluded as it is for batch 1. The engine's step counter checks the premise (the
  run takes exactly 64 steps); when the loop started before all 8 arrived and the prefills took k extra steps,
  8 * k tokens are left out, which makes the figure a lower bound (the row says so). One run per mode per round.
  Target (fp32): >= 100 tok/s.
- transformers decode at batch 1 after a 512-token prompt: `generate` of n tokens minus `generate` of 1 token
  (same prompt, greedy), so the prefill cancels out; both halves run in the same round, and the fastest
  generate(n) minus the fastest generate(1) counts. With `--hf-batch8` also at batch 8 (in the batch-8 rounds).
- llama.cpp (llama-cpp-python, optional): decode at batch 1 after a 512-token prompt, `Llama.eval([tok])` one
  token at a time for 64 tokens (the exact count), `reset()` and the prompt before each run. It runs the GGUF
  file as stored (SmolLM2's file is Q4_1), so it reads fewer weight bytes than any of our modes.
  Stretch target: a compressed-weight mode (fp16 or gguf here; the fastest answers it) decodes at batch 1 at
  >= llama.cpp / 1.5.
- TTFT of a 2,000-token prompt whose first 1,800 tokens are cached, against the same prompt with the cache
  off (target: speedup >= 0.8 x prompt tokens / computed tokens), fp32; cache on and off alternate per round.
- one paged decode step against one contiguous-KV decode step with the same model (target: <= 1.2x), fp32,
  alternating step by step, by three paths: through the decode mirror (the Engine's path; the table shuffled, the
  one-time fill reported apart), reading allocator-order pages in place, and the gather fallback on a shuffled
  table (what runs past the mirror's memory budget).

On a shared machine noise only adds time, so the fastest round is the estimate of the cost itself.
Prints each round and each result as it comes, then one markdown table whose header gives the bandwidth range
seen; `--json PATH` writes every row with its numbers and every round. transformers and llama-cpp-python are
benchmark-only dependencies: each is skipped with a message if missing.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# First: runtime sets libgomp's spin defaults, which only take effect if torch is not loaded yet.
import radixcache.runtime  # noqa: F401

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

from radixcache.runtime import Engine
from radixcache.runtime.kv.mirror import DecodeMirror
from radixcache.runtime.kv.pool import KVPool
from radixcache.runtime.loading import load_model
from radixcache.runtime.model.attention import build_decode_meta
from radixcache.runtime.model.llama import LlamaModel

PAGE = 16
DECODE_B1_TARGET = 25.0  # tok/s, fp32
DECODE_B8_TARGET = 100.0  # tok/s aggregate, fp32
LLAMA_CPP_FACTOR = 1.5  # a compressed-weight mode's batch-1 decode within 1.5x of llama.cpp (the stretch target)


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


# ---------------------------------------------------------------------- rounds

ROUNDS: list[dict[str, Any]] = []  # every round of every phase, warm-ups included (the JSON's "rounds")

Measure = Callable[[], dict[str, float]]


def fmt_num(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() or abs(v) >= 100 else f"{v:,.1f}"


def run_rounds(phase: str, s: Settings, contenders: dict[str, Measure]) -> dict[str, list[dict[str, float]]]:
    """One warm-up round, then `s.reps` counted rounds. In each round every contender runs once, one after the
    other, in the order given (ours in each mode, then transformers, then llama.cpp), so that all of them see
    the same memory-bandwidth window. The memory bandwidth is measured at the start of each round. Returns each
    contender's measurements in the counted rounds."""
    counted: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
    for r in range(s.reps + 1):
        bw = memory_bandwidth_gbs()
        label = "warm-up round" if r == 0 else f"round {r}/{s.reps}"
        print(f"  [{phase}, {label}] memory bandwidth {bw:.1f} GB/s", flush=True)
        values = {name: fn() for name, fn in contenders.items()}
        ROUNDS.append({"phase": phase, "round": r, "warmup": r == 0, "bandwidth_gbs": bw, "values": values})
        for name, vals in values.items():
            print(f"    {name}: " + ", ".join(f"{fmt_num(v)} {k}" for k, v in vals.items()), flush=True)
        if r:
            for name, vals in values.items():
                counted[name].append(vals)
    return counted


def phase_bandwidth(phase: str) -> list[float]:
    return [r["bandwidth_gbs"] for r in ROUNDS if r["phase"] == phase and not r["warmup"]]


def bw_note(phase: str) -> str:
    bws = phase_bandwidth(phase)
    if not bws:
        return ""
    if len(bws) == 1:
        return f"bandwidth {bws[0]:.0f} GB/s (1 round)"
    return f"bandwidth {min(bws):.0f}-{max(bws):.0f} GB/s over {len(bws)} rounds"


# ---------------------------------------------------------------------- contenders


@dataclass
class Ours:
    mode: str
    model: LlamaModel

    @property
    def tag(self) -> str:
        return "fp32" if self.mode == "none" else self.mode


@dataclass
class HF:
    model: Any
    label: str

    def forward_ms(self, ids: torch.Tensor) -> dict[str, float]:
        # The prompt's forward pass producing the last logits, as ours does: no KV cache kept, no sampling.
        with torch.inference_mode():
            sec = timed_once(lambda: self.model(input_ids=ids, use_cache=False, logits_to_keep=1))
        return {"ms": sec * 1000}

    def generate_ms(self, ids: torch.Tensor, n: int) -> dict[str, float]:
        """generate(1) and generate(n) of the same prompt in the same round: their difference is the decode."""
        mask = torch.ones_like(ids)

        def gen(k: int) -> None:
            with torch.inference_mode():
                self.model.generate(
                    ids, attention_mask=mask, max_new_tokens=k, min_new_tokens=k, do_sample=False, pad_token_id=0
                )

        return {
            "ms generate(1)": timed_once(lambda: gen(1)) * 1000,
            f"ms generate({n})": timed_once(lambda: gen(n)) * 1000,
        }


@dataclass
class LlamaCpp:
    llm: Any
    label: str

    def eval_ms(self, ids: list[int]) -> dict[str, float]:
        def run() -> None:
            self.llm.reset()  # n_tokens = 0: the next eval overwrites the KV from position 0
            self.llm.eval(ids)

        return {"ms": timed_once(run) * 1000}

    def decode_tps(self, prompt: list[int], new: list[int]) -> dict[str, float]:
        self.llm.reset()
        self.llm.eval(prompt)
        t = time.perf_counter()
        for tok in new:
            self.llm.eval([tok])
        return {"tok/s": len(new) / (time.perf_counter() - t)}


def load_llama_cpp(path: str, s: Settings) -> LlamaCpp | None:
    try:
        import llama_cpp
    except ImportError as exc:
        msg = f"llama-cpp-python is not importable ({exc}): .venv/bin/pip install llama-cpp-python"
        print(f"  SKIPPED llama.cpp: {msg}")
        row("llama.cpp", "not measured", "", msg)
        return None
    llm = llama_cpp.Llama(
        model_path=path,
        n_ctx=4096,
        n_threads=s.threads,
        n_threads_batch=s.threads,
        n_batch=512,
        verbose=False,
        logits_all=False,
    )
    return LlamaCpp(llm, f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, {os.path.basename(path)})")


def load_hf(path: str) -> HF | None:
    try:
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        msg = "transformers is not installed: .venv/bin/pip install transformers gguf accelerate"
        print(f"  SKIPPED the transformers comparison: {msg}")
        row("transformers", "not measured", "", msg)
        return None
    folder, name = os.path.split(path)
    with contextlib.redirect_stderr(io.StringIO()):  # its GGUF conversion progress bars would swamp the output
        hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    hf.eval()
    return HF(hf, f"transformers {transformers.__version__} fp32")


class RawStep:
    """`model.decode` on this thread (no engine): `batch` sequences at context `ctx` (the new token included),
    reading the decode mirror as the Engine does (`mirror=True`), or the pages (the gather / in-place paths)."""

    def __init__(self, model: LlamaModel, batch: int, ctx: int, mirror: bool = True) -> None:
        n_pages = -(-ctx // PAGE)
        self.model = model
        self.pool = model.new_pool(batch * n_pages, PAGE)
        tables = [list(range(b * n_pages, (b + 1) * n_pages)) for b in range(batch)]
        vocab = model.config.vocab_size
        with torch.inference_mode():
            for b in range(batch):
                model.prefill(prompt_ids(ctx - 1, vocab, 100 + b), 0, tables[b], self.pool)
        self.meta = build_decode_meta(tables, [ctx] * batch, PAGE, model.device)
        self.toks = prompt_ids(batch, vocab, 9)
        self.step = None
        if mirror:  # filled once; every timed step then rewrites the same position, as a steady-state step writes one
            rows = DecodeMirror(model.config, model.dtype, model.device, 1 << 40, native=model.native)
            self.step = rows.prepare(list(range(batch)), tables, [ctx] * batch, self.pool)

    def step_ms(self, steps: int) -> dict[str, float]:
        """Fastest of `steps` steps after one untimed step (the previous contender left the caches cold)."""
        with torch.inference_mode():
            sec = timed(lambda: self.model.decode(self.toks, self.meta, self.pool, self.step), steps)
        return {"ms/step": sec * 1000}


RAW_STEPS_B1 = 5  # raw decode steps timed per round at batch 1 (the fastest counts)
RAW_STEPS_B8 = 3


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


def best(runs: list[dict[str, float]], key: str, fastest: Callable[..., Any] = min) -> float:
    return fastest(r[key] for r in runs)


# ---------------------------------------------------------------------- phases


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


def hf_decode_tps(runs: list[dict[str, float]], batch: int, n: int) -> float | None:
    """transformers decode tok/s: fastest generate(n) minus fastest generate(1), both over the same rounds.
    None: machine noise exceeded the decode time, so the difference says nothing (more --reps)."""
    first = best(runs, "ms generate(1)") / 1000
    full = best(runs, f"ms generate({n})") / 1000
    return batch * (n - 1) / (full - first) if full > first else None


def show_tps(tps: float | None) -> str:
    return f"{tps:.1f} tok/s" if tps else "not measurable (noise > decode time)"


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
            "tok/s": engine.generate(ids, s.decode_tokens, ignore_eos=True).decode_tps
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
        hf1 = hf_decode_tps(runs["transformers"], 1, s.decode_tokens)
        row(
            f"decode, batch 1 ({s.prompt}-token prompt): {hf.label}",
            "",
            show_tps(hf1),
            f"generate({s.decode_tokens}) - generate(1), each the fastest of its rounds; {bwn}",
            tps=hf1,
        )
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
    compressed = {o.tag: best(runs[f"ours {o.tag} Engine"], "tok/s", max) for o in ours if o.tag != "fp32"}
    if lc1 and compressed:  # the stretch target asks for one compressed-weight mode: the fastest one answers it
        tag, tps = max(compressed.items(), key=lambda kv: kv[1])
        need = lc1 / LLAMA_CPP_FACTOR
        others = "; ".join(f"{t} {v:.1f} tok/s" for t, v in compressed.items() if t != tag)
        row(
            f"stretch: decode, batch 1, best compressed-weight mode (of {', '.join(compressed)}) vs llama.cpp",
            f"{tag} {tps:.1f} tok/s",
            f"llama.cpp {lc1:.1f} tok/s",
            f"{lc1 / tps:.2f}x slower than llama.cpp; target >= llama.cpp / {LLAMA_CPP_FACTOR} = {need:.1f} tok/s: "
            f"{verdict(tps >= need)}" + (f"; {others}" if others else ""),
            mode=tag,
            tps=tps,
            lc_tps=lc1,
        )
    gc.collect()


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
        hf8 = hf_decode_tps(runs["transformers"], 8, s.decode_tokens)
        row(
            f"decode, batch 8 aggregate: {hf.label}",
            "",
            show_tps(hf8),
            f"generate({s.decode_tokens}) - generate(1), each the fastest of its rounds; {bwn}",
            tps=hf8,
        )
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

    hidden = model._layers(torch.tensor([token]), positions, pool, positions, attend, False)
    return model._logits(hidden, prefill=False)


PAGED_PATHS = {
    "mirror": "shuffled table, decode mirror (the Engine's path)",
    "in place": "allocator-order table: read in place (no mirror)",
    "gather": "shuffled table: gather path (no mirror: the fallback past the mirror's budget)",
}


def decode_step_costs(model: LlamaModel, ctx: int, reps: int, path: str) -> tuple[float, float, float]:
    """Seconds of one decode step at context `ctx`, paged and contiguous, and of filling the decode mirror once
    (0 for the paths without it). "mirror" and "gather" draw the block table at random from twice as many blocks;
    "in place" takes consecutive ids in descending order, as the free stack hands them out
    (radixcache.runtime.model.attention.page_runs)."""
    ids = prompt_ids(ctx, model.config.vocab_size, 5)
    n_pages = -(-ctx // PAGE)
    paged = model.new_pool(n_pages * 2, PAGE)
    if path == "in place":
        table = list(range(2 * n_pages - 1, n_pages - 1, -1))
    else:
        table = torch.randperm(n_pages * 2, generator=torch.Generator().manual_seed(0))[:n_pages].tolist()
    flat = KVPool(model.config, 1, ctx, dtype=model.dtype, device=model.device)
    with torch.inference_mode():
        model.prefill(ids[:-1], 0, table, paged)
        model.prefill(ids[:-1], 0, [0], flat)
        meta = build_decode_meta([table], [ctx], PAGE, model.device)
        fill = 0.0
        step = None
        if path == "mirror":
            t = time.perf_counter()
            rows = DecodeMirror(model.config, model.dtype, model.device, 1 << 40, native=model.native)
            step = rows.prepare([0], [table], [ctx], paged)
            fill = time.perf_counter() - t
        a = model.decode(ids[-1:], meta, paged, step)
        b = contiguous_step(model, flat, ids[-1], ctx)
        assert (a - b).abs().max().item() < 1e-3
        p = c = float("inf")
        for _ in range(reps):  # interleaved, so that machine noise hits both alike
            p = min(p, timed(lambda: model.decode(ids[-1:], meta, paged, step), 1))
            c = min(c, timed(lambda: contiguous_step(model, flat, ids[-1], ctx), 1))
    return p, c, fill


def bench_paged_vs_contiguous(model: LlamaModel, s: Settings) -> None:
    for path, label in PAGED_PATHS.items():
        for ctx in s.paged_ctx:
            paged_s, flat_s, fill_s = decode_step_costs(model, ctx, s.reps * 4, path)
            ratio = paged_s / flat_s
            fill = f"; the mirror filled once in {fill_s * 1000:.1f} ms" if path == "mirror" else ""
            row(
                f"decode step at {ctx} tokens, paged (page {PAGE}, {label}), fp32",
                f"{paged_s * 1000:.1f} ms",
                f"contiguous {flat_s * 1000:.1f} ms",
                f"{ratio:.2f}x; target <= 1.2x: {verdict(ratio <= 1.2)}{fill}",
                ratio=ratio,
                fill_ms=fill_s * 1000,
            )


# ---------------------------------------------------------------------- main


SECTIONS = ("prefill", "decode1", "decode8", "ttft", "paged")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quant", default="none,fp16,gguf", help="comma list of our modes: none, fp16, gguf")
    ap.add_argument("--threads", type=int, default=0, help="threads for torch, the engine and llama.cpp (0: torch's)")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    ap.add_argument("--hf-batch8", action="store_true", help="also measure transformers decode at batch 8 (slow)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp comparison")
    ap.add_argument(
        "--reps",
        type=int,
        default=3,
        help="counted rounds per comparison, after one warm-up round (each contender's best counts)",
    )
    ap.add_argument("--decode-tokens", type=int, default=64, help="new tokens per decode measurement")
    ap.add_argument("--quick", action="store_true", help="smoke run: prefill 128 only, short prompts, 8 tokens")
    ap.add_argument("--json", metavar="PATH", help="write every row, with its numbers, to this JSON file")
    ap.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma list of the sections to run: {', '.join(SECTIONS)} (default: all)",
    )
    args = ap.parse_args()
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    if not only or only - set(SECTIONS):
        ap.error(f"--only: unknown section(s) {sorted(only - set(SECTIONS))}; choose from {', '.join(SECTIONS)}")
    args.only = only
    return args


def memory_bandwidth_gbs() -> float:
    """Read bandwidth now, best of 3 sums over 512 MB. On a shared VM it halves when neighbours load the memory
    bus (seen here: 55 and 28 GB/s an hour apart), and every weight-streaming number here moves with it."""
    data = torch.ones(128 * 2**20)
    best = min(timed_once(data.sum) for _ in range(3))
    return data.numel() * 4 / best / 1e9


def timed_once(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    args = parse_args()
    modes = [m.strip() for m in args.quant.split(",") if m.strip()]
    for m in modes:
        if m not in ("none", "fp16", "gguf"):
            raise SystemExit(f"--quant: unknown mode {m!r} (none, fp16, gguf)")
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
    bandwidth = memory_bandwidth_gbs()
    header: dict[str, Any] = {
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "threads": threads,
        "torch": torch.__version__,
        "load_average": load,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "bandwidth_gbs_start": bandwidth,
        "reps": s.reps,
        "quick": args.quick,
    }
    print(
        f"# {header['cpu']}, {os.cpu_count()} CPUs, {threads} threads, torch {torch.__version__}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, OMP_WAIT_POLICY={header['omp_wait_policy']}, "
        f"memory bandwidth {bandwidth:.1f} GB/s"
        + (" (--quick: smoke-run sizes, not the issue's)" if args.quick else ""),
        flush=True,
    )

    # Everything is loaded first, so that every comparison below can run in interleaved rounds.
    t = time.perf_counter()
    smol = load_model(args.model, keep_blocks="gguf" in modes)
    print(f"  loaded {smol.config.name} from {smol.source} in {time.perf_counter() - t:.1f} s", flush=True)
    hf = None
    if args.no_hf:
        row("transformers", "not measured", "", "--no-hf")
    else:
        t = time.perf_counter()
        hf = load_hf(smol.source)
        if hf:
            print(f"  loaded {hf.label} in {time.perf_counter() - t:.1f} s", flush=True)
    lc = None
    if args.no_llama_cpp:
        row("llama.cpp", "not measured", "", "--no-llama-cpp")
    else:
        lc = load_llama_cpp(smol.source, s)
        if lc:
            print(f"  loaded {lc.label}", flush=True)
    ours: list[Ours] = []
    for mode in modes:
        tag = "fp32" if mode == "none" else mode
        try:
            blocks = smol.blocks if mode == "gguf" else None
            ours.append(Ours(mode, LlamaModel(smol.config, smol.weights, quant=mode, blocks=blocks)))
        except ValueError as exc:
            print(f"  SKIPPED quant={mode}: {exc}")
            row(f"ours {tag}", "not measured", "", str(exc))
    gc.collect()
    vocab = smol.config.vocab_size

    if "prefill" in args.only:
        print("## prefill", flush=True)
        bench_prefill(ours, hf, lc, s, vocab)
    if "decode1" in args.only:
        print("## decode, batch 1", flush=True)
        bench_decode1(ours, hf, lc, s, vocab)
    if "decode8" in args.only:
        print("## decode, batch 8", flush=True)
        bench_decode8(ours, hf, s, vocab)
    fp32 = next((o for o in ours if o.mode == "none"), None)
    if {"ttft", "paged"} & args.only and fp32 is None:
        print("  (TTFT and paged-vs-contiguous rows are measured with fp32 only: add none to --quant)")
    elif {"ttft", "paged"} & args.only and fp32 is not None:
        print("## ours fp32: TTFT with the cache, paged against contiguous KV", flush=True)
        if "ttft" in args.only:
            bench_ttft(fp32.model, s)
        if "paged" in args.only:
            bench_paged_vs_contiguous(fp32.model, s)

    header["bandwidth_gbs_end"] = memory_bandwidth_gbs()
    seen = [r["bandwidth_gbs"] for r in ROUNDS] + [bandwidth, header["bandwidth_gbs_end"]]
    header["bandwidth_gbs_range"] = [min(seen), max(seen)]
    print(
        f"\nmemory bandwidth {min(seen):.1f}-{max(seen):.1f} GB/s over {len(ROUNDS)} rounds "
        f"({bandwidth:.1f} GB/s at the start, {header['bandwidth_gbs_end']:.1f} GB/s at the end); every comparison "
        f"ran interleaved: one warm-up and {s.reps} counted rounds, each contender's best round counts"
    )
    print("| metric | ours | baseline | ratio / note |")
    print("| --- | --- | --- | --- |")
    for r in ROWS:
        print(f"| {r.metric} | {r.ours} | {r.base} | {r.note} |")
    met = sum(r.note.count(": met") for r in ROWS)
    missed = [r.metric for r in ROWS if ": MISSED" in r.note]
    print(f"\ntargets: {met} met, {len(missed)} missed" + "".join(f"\n  MISSED: {m}" for m in missed))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"header": header, "rounds": ROUNDS, "rows": [asdict(r) for r in ROWS]}, f, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
