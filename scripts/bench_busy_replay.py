"""The README's main job on a busy machine, end to end: the sample replay idle and beside a compiler build.

    .venv/bin/python scripts/bench_busy_replay.py                        # fp32, 2 rounds, 2 compile jobs, ~4 min
    .venv/bin/python scripts/bench_busy_replay.py --quant gguf --load spin --jobs 1 --rounds 3
    [--quant none|gguf] [--load compile|spin] [--jobs 2] [--rounds 2] [--threads 2] [--trace FILE] [--model M]
    [--limit N] [--settle 2] [--json FILE]

Issue 33 opened on this: beside a compiler building in the background, `radixcache replay` took 607 s instead of
54 s and decoded at 1.1 tok/s, because a spinning OpenMP team of two threads waits at every barrier for a thread
the kernel has descheduled. Each run here is `radixcache replay --json` (the built-in model and sample trace unless
`--trace`, cache on) in a process of its own, with `--thread-policy adaptive` (the default) and `fixed`, on an idle
machine and beside `--jobs` background jobs:
- `compile` (default): each job a shell loop of `cc -O2 -c` over the project's C sources into a temporary folder,
  a build's load: processes that start and end every second or so, so a snapshot of the machine can miss them;
- `spin`: each job `python -c 'while True: pass'`, a steady load.
The jobs start `--settle` seconds (2) before the replay, and the next run waits as long after they are killed; each
job is its own process group, killed by its pid at the end (nothing else is touched). Every round runs the four
(load, policy) pairs, their order rotated per round. The table gives medians over rounds of wall time, decode tok/s
and TTFT p50 / p99, with each policy's busy / idle ratios, and adaptive against fixed beside the load; the load
average is read before each run ("idle" means no load started by this script). Run it alone: anything else running
is part of the load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("adaptive", "fixed")
LOADS = ("idle", "busy")
FIELDS = ("wall_s", "decode_tps", "ttft_p50_s", "ttft_p99_s")


def start_load(kind: str, jobs: int, scratch: Path) -> list[subprocess.Popen[bytes]]:
    """`jobs` background jobs of `kind`, each the leader of its own process group."""
    if kind == "spin":
        cmd = [sys.executable, "-c", "while True: pass"]
        return [subprocess.Popen(cmd, start_new_session=True) for _ in range(jobs)]
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise SystemExit(f"--load compile needs a C compiler: {compiler!r} was not found (set CC, or --load spin)")
    sources = " ".join(shlex.quote(str(p)) for p in sorted((ROOT / "runtime" / "native").glob("*.c")))
    cc = shlex.quote(compiler)
    procs = []
    for j in range(jobs):
        out = shlex.quote(str(scratch / f"job{j}.o"))
        loop = f'while :; do for f in {sources}; do {cc} -O2 -c "$f" -o {out}; done; done'
        procs.append(subprocess.Popen(["sh", "-c", loop], start_new_session=True, stderr=subprocess.DEVNULL))
    return procs


def stop_load(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:  # each job's group: the shell loop and the compiler it is running now
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def replay(args: argparse.Namespace, policy: str, out: Path) -> dict[str, Any]:
    """One `radixcache replay --json` run in its own process; its summary."""
    cmd = [sys.executable, "-c", "from radixcache.cli.main import run; run()", "replay", "--json", str(out)]
    cmd += ["--quant", args.quant, "--threads", str(args.threads), "--thread-policy", policy]
    cmd += (["--model", args.model] if args.model else []) + (["--limit", str(args.limit)] if args.limit else [])
    cmd += [args.trace] if args.trace else []
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(f"replay ({policy}) failed with exit {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(out.read_text())["summary"]


def bench(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {f"{load}/{policy}": [] for load in LOADS for policy in POLICIES}
    groups: list[int] = []  # the process group of every job started (its leader's pid)
    pairs = [(load, policy) for load in LOADS for policy in POLICIES]
    with tempfile.TemporaryDirectory(prefix="busy-replay-") as tmp:
        scratch = Path(tmp)
        for r in range(args.rounds):
            for load, policy in pairs[r % len(pairs) :] + pairs[: r % len(pairs)]:
                procs = start_load(args.load, args.jobs, scratch) if load == "busy" else []
                groups += [p.pid for p in procs]
                try:
                    if procs:
                        time.sleep(args.settle)
                    before = os.getloadavg()[0]
                    summary = replay(args, policy, scratch / "replay.json")
                finally:
                    stop_load(procs)
                row = {k: summary[k] for k in FIELDS} | {"load_avg": before, "hit_rate": summary["hit_rate"]}
                runs[f"{load}/{policy}"].append(row)
                print(
                    f"round {r + 1} {load:4} {policy:8}: wall {row['wall_s']:6.1f} s, decode {row['decode_tps']:6.1f} "
                    f"tok/s, TTFT p50 {row['ttft_p50_s'] * 1e3:6.0f} ms, p99 {row['ttft_p99_s'] * 1e3:6.0f} ms "
                    f"(load {before:.2f})",
                    flush=True,
                )
                if load == "busy":
                    time.sleep(args.settle)  # the load average and the engine's next start see the jobs gone
    return {"args": vars(args), "runs": runs, "load_groups": groups}


def median(runs: list[dict[str, Any]], field: str) -> float:
    return statistics.median(r[field] for r in runs)


def report(result: dict[str, Any]) -> str:
    runs, args = result["runs"], result["args"]
    lines = [
        f"\nSample replay (`radixcache replay`, quant {args['quant']}, {args['threads']} threads), idle and beside "
        f"{args['jobs']} {args['load']} job(s); medians of {args['rounds']} round(s)\n",
        "| policy | load | wall s | decode tok/s | TTFT p50 ms | TTFT p99 ms | decode kept | wall busy / idle |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for policy in POLICIES:
        idle = runs[f"idle/{policy}"]
        for load in LOADS:
            rs = runs[f"{load}/{policy}"]
            kept = median(rs, "decode_tps") / median(idle, "decode_tps")
            slower = median(rs, "wall_s") / median(idle, "wall_s")
            lines.append(
                f"| {policy} | {load} | {median(rs, 'wall_s'):.1f} | {median(rs, 'decode_tps'):.1f} | "
                f"{median(rs, 'ttft_p50_s') * 1e3:.0f} | {median(rs, 'ttft_p99_s') * 1e3:.0f} | {kept:.0%} | "
                f"{slower:.2f}x |"
            )
    busy_a, busy_f = runs["busy/adaptive"], runs["busy/fixed"]
    lines.append(
        f"\nbeside the load, adaptive against fixed: wall {median(busy_f, 'wall_s') / median(busy_a, 'wall_s'):.2f}x "
        f"shorter, decode {median(busy_a, 'decode_tps') / median(busy_f, 'decode_tps'):.2f}x faster, TTFT p99 "
        f"{median(busy_f, 'ttft_p99_s') / median(busy_a, 'ttft_p99_s'):.2f}x shorter"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quant", default="none", choices=["none", "gguf"])
    ap.add_argument("--load", default="compile", choices=["compile", "spin"])
    ap.add_argument("--jobs", type=int, default=2, help="background jobs beside the busy runs")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trace", help="a trace file (default: the built-in sample)")
    ap.add_argument("--model", help="the replay's --model (default: the built-in SmolLM2)")
    ap.add_argument("--limit", type=int, help="the replay's --limit: at most this many conversations")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds one replay may take")
    ap.add_argument(
        "--settle", type=float, default=2.0, help="seconds the jobs run before a busy replay, and the wait after it"
    )
    ap.add_argument("--json", help="write every run here")
    args = ap.parse_args()
    if args.jobs < 1 or args.rounds < 1 or args.threads < 1:
        ap.error("--jobs, --rounds and --threads must be >= 1")
    if not 0 <= args.settle < float("inf"):
        ap.error("--settle must be a finite number of seconds >= 0")
    result = bench(args)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
