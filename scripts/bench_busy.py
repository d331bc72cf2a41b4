"""Decode on a busy machine: how much of its idle speed the engine keeps beside other programs (issue 33).

    .venv/bin/python scripts/bench_busy.py --markdown                  # fp32, gguf and llama.cpp, ~10 min on 2 cores
    .venv/bin/python scripts/bench_busy.py --quants gguf --rounds 1 --prompt 64 --tokens 16   # a smoke run
    [--quants fp32,gguf] [--busy 0,1,2] [--rounds 3] [--prompt 512] [--tokens 64] [--threads 2]
    [--llama-threads 2,1 | --no-llama-cpp] [--spin] [--markdown] [--json FILE]

Batch 1 on SmolLM2: `--tokens` greedy tokens after a `--prompt`-token prompt (cache off: every run prefills the
whole prompt), decode tok/s as the result's `decode_tps` (tokens after the first, over the time after the first).
Beside it, `--busy` levels of load: that many `python -c 'while True: pass'` processes, started by this script
half a second before the level's runs and killed by pid after them.

Variants, each an Engine on one shared model per quant:
- adaptive: `threads=--threads` with the thread controller (runtime.engine.threads), the default;
- fixed N: `thread_policy="fixed"` at --threads threads, and at 1 thread. The kernel plan belongs to the model, so
  all three run the plan measured (or cached) for --threads threads: the 1-thread engine is built first with the
  fixed rules, then the others apply the --threads plan, the one the adaptive engine keeps when it drops a thread;
- llama.cpp: llama-cpp-python on the same GGUF file (as stored: SmolLM2's is Q4_1) at each of `--llama-threads`,
  in a process of its own: `reset()`, `eval` of the same prompt, then `--tokens` fixed tokens one `eval([tok])`
  at a time, tok/s over those (skipped with a message when llama_cpp does not import; `--no-llama-cpp`);
- with `--spin`, the adaptive and fixed --threads engines again in a process started with OMP_WAIT_POLICY=PASSIVE
  (libgomp's waiting threads sleep at once instead of spinning; it must be set before torch loads, so each spin
  setting is its own worker process).
Every round runs each load level (in an order rotated per round) and, within it, every variant (rotated too); one
warm-up run of each variant comes first. The adaptive engine keeps its state from run to run, as a server would:
after a busy level it starts on fewer threads and must notice the idle machine itself. The table gives medians
over rounds and the share of each variant's own idle median kept under load, plus the load average before each
round (other programs on the machine count too: "idle" means no load started by this script). Below it, the
issue's acceptance: the adaptive engine keeps >= 55% with one busy process and >= 40% with two (fair shares of two
cores: 67% and 50%), in fp32 and gguf.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SPINS = {"default": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}}
BUSY_LOOP = "while True: pass"
KEEP = {1: 0.55, 2: 0.40}  # issue 33: the share of the idle speed to keep beside 1 and 2 busy processes


# ---------------------------------------------------------------------- workers (one process each)


def prompt_ids(n: int) -> list[int]:
    return [100 + (7 * i) % 40000 for i in range(n)]


def ours_worker(args: argparse.Namespace) -> None:
    """Load the model once, build the engines, then answer one JSON command per stdin line."""
    sys.path.insert(0, str(ROOT))
    from radixcache.runtime import Engine
    from radixcache.runtime.loading import load_model
    from radixcache.runtime.model.llama import LlamaModel

    quants = args.quants.split(",")
    loaded = load_model("smollm2", keep_blocks="gguf" in quants)
    engines: dict[str, Any] = {}
    plans = [("fixed 1", 1, "fixed", "fixed")] if args.threads != 1 else []  # first: see the docstring
    plans += [
        ("adaptive", args.threads, "adaptive", args.kernels),
        (f"fixed {args.threads}", args.threads, "fixed", args.kernels),
    ]
    for quant in quants:
        mode = "none" if quant == "fp32" else quant
        blocks = loaded.blocks if mode == "gguf" else None
        model = LlamaModel(loaded.config, loaded.weights, quant=mode, blocks=blocks)
        for variant, n, policy, kernels in plans:
            engines[f"{quant}/{variant}"] = Engine(
                model,
                tokenizer=loaded.tokenizer,
                threads=n,
                thread_policy=policy,
                kernels=kernels,
                kv_memory="64MiB",
                enable_cache=False,
            )
    ids = prompt_ids(args.prompt)
    print(json.dumps({"ready": list(engines)}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        engine = engines[cmd["engine"]]
        changes = engine.stats.thread_changes
        r = engine.generate(ids, cmd["tokens"], ignore_eos=True)
        s = engine.stats
        out = {"tok/s": r.decode_tps, "threads": s.threads, "changes": s.thread_changes - changes}
        print(json.dumps(out), flush=True)


def llama_worker(args: argparse.Namespace) -> None:
    """llama.cpp on SmolLM2's GGUF file at each of --llama-threads, answering as ours_worker does."""
    sys.path.insert(0, str(ROOT))
    try:
        import llama_cpp
    except ImportError as exc:
        print(json.dumps({"skip": f"llama_cpp does not import ({exc}): .venv/bin/pip install llama-cpp-python"}))
        return
    from radixcache.runtime.loading import resolve_model_path

    path = str(resolve_model_path("smollm2"))
    llms = {
        f"llama.cpp {n}": llama_cpp.Llama(
            model_path=path,
            n_ctx=args.prompt + args.tokens + 64,
            n_threads=n,
            n_threads_batch=n,
            n_batch=512,
            verbose=False,
        )
        for n in (int(t) for t in args.llama_threads.split(","))
    }
    ids = prompt_ids(args.prompt)
    new = prompt_ids(args.prompt + args.tokens)[args.prompt :]  # fixed tokens: the count is exact, no sampling
    print(
        json.dumps({"ready": list(llms), "version": llama_cpp.__version__, "file": os.path.basename(path)}), flush=True
    )
    for line in sys.stdin:
        cmd = json.loads(line)
        llm = llms[cmd["engine"]]
        llm.reset()
        llm.eval(ids)
        t = time.perf_counter()
        for tok in new[: cmd["tokens"]]:
            llm.eval([tok])
        n = min(cmd["tokens"], len(new))
        out = {"tok/s": n / (time.perf_counter() - t), "threads": int(cmd["engine"].split()[-1]), "changes": 0}
        print(json.dumps(out), flush=True)


class Worker:
    def __init__(self, kind: str, spin: str, args: argparse.Namespace) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        env |= SPINS[spin]
        cmd = [sys.executable, __file__, "--worker", kind, "--quants", args.quants, "--threads", str(args.threads)]
        cmd += ["--prompt", str(args.prompt), "--tokens", str(args.tokens), "--llama-threads", args.llama_threads]
        cmd += ["--kernels", args.kernels]
        self.spin = spin
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        hello = self._reply()
        self.skip: str | None = hello.get("skip")
        self.engines: list[str] = hello.get("ready", [])
        self.info = {k: v for k, v in hello.items() if k not in ("ready", "skip")}

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.spin} worker exited ({self.proc.wait()})")
        return json.loads(line)

    def run(self, engine: str, tokens: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"engine": engine, "tokens": tokens}) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------------- the rounds


def start_busy(n: int) -> list[subprocess.Popen[bytes]]:
    """Start `n` single-thread busy loops and give them half a second to be scheduled (none: no wait)."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(n)]
    time.sleep(0.5 if n else 0)
    return procs


def stop_busy(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
        p.wait()


def rotated(items: list[Any], k: int) -> list[Any]:
    k %= len(items)
    return items[k:] + items[:k]


def bench(args: argparse.Namespace) -> dict[str, Any]:
    levels = [int(b) for b in args.busy.split(",")]
    kinds = [("ours", "default")] + ([("ours", "passive")] if args.spin else [])
    kinds += [] if args.no_llama_cpp else [("llama", "default")]
    workers: dict[tuple[str, str], Worker] = {}
    notes: list[str] = []
    for kind in kinds:
        w = Worker(kind[0], kind[1], args)
        if w.skip:
            notes.append(f"llama.cpp not measured: {w.skip}")
            print(notes[-1], file=sys.stderr, flush=True)
            w.close()
        else:
            workers[kind] = w
            if w.info:
                notes.append(f"llama.cpp: llama-cpp-python {w.info['version']}, {w.info['file']}")
    cells: list[tuple[tuple[str, str], str]] = []  # (worker, engine)
    for k, w in workers.items():
        cells += [(k, e) for e in w.engines if k[1] == "default" or not e.endswith("fixed 1")]
    runs: dict[str, list[dict[str, Any]]] = {}
    loads: list[list[float]] = []
    busy: list[subprocess.Popen[bytes]] = []
    try:
        for k, engine in cells:  # warm-up: the native kernel's build, each team's first start
            workers[k].run(engine, 8)
        for r in range(args.rounds):
            loads.append([round(x, 2) for x in os.getloadavg()])
            print(f"round {r + 1}/{args.rounds}: load average {loads[-1]}", file=sys.stderr, flush=True)
            for level in rotated(levels, r):
                busy = start_busy(level)
                for k, engine in rotated(cells, r):
                    out = workers[k].run(engine, args.tokens)
                    key = f"{engine}{'' if k[1] == 'default' else ' passive'}|{level}"
                    runs.setdefault(key, []).append(out)
                    print(f"  busy {level} {key.split('|')[0]}: {out['tok/s']:.1f} tok/s", file=sys.stderr, flush=True)
                stop_busy(busy)
                busy = []
    finally:
        stop_busy(busy)
        for w in workers.values():
            w.close()
    return {"levels": levels, "runs": runs, "load_average": loads, "notes": notes, "args": vars(args)}


def medians(result: dict[str, Any]) -> dict[str, dict[int, float]]:
    levels, runs = result["levels"], result["runs"]
    names = list(dict.fromkeys(k.split("|")[0] for k in runs))
    return {n: {b: statistics.median(x["tok/s"] for x in runs[f"{n}|{b}"]) for b in levels} for n in names}


def report(result: dict[str, Any], markdown: bool) -> str:
    levels, runs = result["levels"], result["runs"]
    med = medians(result)
    head = ["variant"] + [f"{'idle' if b == 0 else f'{b} busy'} tok/s" for b in levels]
    head += [f"kept, {b} busy" for b in levels if b]
    rows = []
    for name, m in med.items():
        row = [name] + [f"{m[b]:.1f}" for b in levels]
        row += [f"{m[b] / m[0]:.0%}" if m.get(0) else "" for b in levels if b]
        if "adaptive" in name:
            ends = {b: sorted({x["threads"] for x in runs[f"{name}|{b}"]}) for b in levels}
            row[0] += " (ended on " + "; ".join(f"{b}: {'/'.join(map(str, t))}" for b, t in ends.items()) + " threads)"
        rows.append(row)
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        lines = ["  ".join(f"{c:>14}" for c in r) for r in [head, *rows]]
    return "\n".join([*lines, "", *acceptance(med, levels)])


def acceptance(med: dict[str, dict[int, float]], levels: list[int]) -> list[str]:
    """Issue 33's check on the adaptive engine of each quant, and llama.cpp's share beside it."""
    out = []
    for name, m in med.items():
        if not name.endswith("/adaptive") and not name.startswith("llama.cpp"):
            continue
        for b in (b for b in levels if b in KEEP):
            kept = m[b] / m[0]
            verdict = f"target >= {KEEP[b]:.0%}: {'met' if kept >= KEEP[b] else 'NOT MET'}"
            out.append(
                f"{name}, {b} busy: kept {kept:.0%} ({m[b]:.1f} of {m[0]:.1f} tok/s)"
                + (f"; {verdict}" if name.endswith("/adaptive") else "")
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quants", default="fp32,gguf")
    p.add_argument("--busy", default="0,1,2", help="busy single-thread processes per level; must include 0")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="the engine's threads (the adaptive engine's most)")
    p.add_argument("--kernels", default="auto", help="the --threads engines' kernels (auto, retune, fixed)")
    p.add_argument("--llama-threads", default="2,1", help="llama.cpp's thread counts (comma list)")
    p.add_argument("--no-llama-cpp", action="store_true")
    p.add_argument("--spin", action="store_true", help="also run the 2-thread engines with OMP_WAIT_POLICY=PASSIVE")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", help="write the runs here")
    p.add_argument("--worker", choices=("ours", "llama"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        (ours_worker if args.worker == "ours" else llama_worker)(args)
        return
    if "0" not in args.busy.split(","):
        p.error("--busy must include 0 (the idle level every ratio is against)")
    result = bench(args)
    print(report(result, args.markdown))
    for note in result["notes"]:
        print(note)
    print(f"load average (1, 5, 15 min) before each round: {result['load_average']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
