"""Time and peak memory of `radixcache simulate` against trace size: streamed (the default) and in memory.

Generates Mooncake-format hash traces of each size (scripts/gen_hash_trace.py: 16-token blocks, about 37 hash ids
per request, constant memory) into `--workdir` (kept between runs), then runs the CLI on each as a subprocess,
LRU at `--capacity-blocks` alone (`--no-infinite`), with the infinite-cache bound (the default), and with
`--belady`, each once streamed and once `--in-memory`. Peak RSS is
the subprocess's own (os.wait4). The CLI reads a streamed hash trace of 8 MiB or more in a second process (its
default `--read-ahead` on two cores or more), so those rows time both processes together; add `--no-read-ahead`
to `RUNS` to compare. A token trace (`trace gen chat`) can be added with `--chat COUNT`.

    .venv/bin/python scripts/bench_simulator.py --sizes 50000,500000,2000000 --chat 20000 \\
        --markdown docs/simulator_bench.md --plot docs/simulator_scale.png
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from gen_hash_trace import write_hash_trace  # noqa: E402
from script_args import at_least  # noqa: E402

from radixcache.runtime import atomic_file  # noqa: E402

CLI = [sys.executable, "-c", "from radixcache.cli.main import run; run()"]


@dataclass(frozen=True, slots=True)
class Row:
    trace: str
    requests: int
    run: str  # "lru alone" (--no-infinite), "lru" (with the infinite bound) or "lru + belady"
    mode: str  # "streamed" or "in memory"
    seconds: float
    peak_rss_mib: float
    hit_rate: float
    belady_hit_rate: float | None


def measure(cmd: list[str]) -> tuple[float, float, dict]:
    """(wall seconds, peak RSS MiB, parsed --json output) of one subprocess."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"})
    out = proc.stdout.read()  # type: ignore[union-attr]
    err = proc.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{err.decode()}")
    return seconds, usage.ru_maxrss / 1024, json.loads(out)


RUNS = {"lru alone": ["--no-infinite"], "lru": [], "lru + belady": ["--belady"]}  # run name -> simulate flags
MODES = ("streamed", "in memory")


# The arguments, checked as they are parsed: a bad one was a traceback, or a failed subprocess once the traces were
# generated, and a mode not in MODES ran streamed under its own name.
def _sizes(text: str) -> list[int]:
    parse = at_least(1)
    try:
        return [parse(part) for part in text.split(",") if part.strip()] or [parse("")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected request counts >= 1 separated by commas, got {text!r}") from None


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise argparse.ArgumentTypeError(f"expected modes from {', '.join(MODES)} separated by commas, got {text!r}")
    return list(dict.fromkeys(modes))


def simulate_cmd(trace: Path, capacity: int, block_size: int | None, run: str, in_memory: bool) -> list[str]:
    cmd = [*CLI, "simulate", str(trace), "--capacity-blocks", str(capacity), "--json", *RUNS[run]]
    if block_size is not None:
        cmd += ["--block-size", str(block_size)]
    if in_memory:
        cmd.append("--in-memory")
    return cmd


def hash_trace(workdir: Path, requests: int) -> Path:
    path = workdir / f"hash{requests}.jsonl"
    if not path.exists():
        t0 = time.perf_counter()
        ids = write_hash_trace(path, requests, block_size=16, seed=0)
        print(f"generated {path.name}: {requests:,} requests, {ids:,} hash ids in {time.perf_counter() - t0:.1f} s")
    return path


def chat_trace(workdir: Path, count: int) -> Path:
    path = workdir / f"chat{count}.jsonl"
    if not path.exists():
        cmd = [*CLI, "trace", "gen", "chat", str(path), "--count", str(count)]
        subprocess.run(cmd, check=True)
    return path


def table(rows: list[Row]) -> str:
    lines = [
        "| trace | requests | run | mode | seconds | peak RSS (MiB) | hit rate | Belady hit rate |",
        "|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        belady = f"{r.belady_hit_rate:.4f}" if r.belady_hit_rate is not None else "-"
        lines.append(
            f"| {r.trace} | {r.requests:,} | {r.run} | {r.mode} | {r.seconds:.1f} | {r.peak_rss_mib:.0f} | "
            f"{r.hit_rate:.4f} | {belady} |"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for run in RUNS:
        for mode, style in (("streamed", "-o"), ("in memory", "--x")):
            # The hash traces only: the x axis is their size (the chat trace is a row of the table, not a point).
            ours = [r for r in rows if r.run == run and r.mode == mode and r.trace.startswith("hash")]
            pts = sorted((r.requests, r.seconds, r.peak_rss_mib) for r in ours)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            left.plot(xs, [p[1] for p in pts], style, label=f"{run}, {mode}")
            right.plot(xs, [p[2] for p in pts], style, label=f"{run}, {mode}")
    for ax, label in ((left, "seconds"), (right, "peak RSS (MiB)")):
        ax.set_xscale("log")
        ax.set_xlabel("requests in the hash trace")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    left.legend(fontsize=8)
    fig.suptitle("radixcache simulate: time and memory against trace size (2 CPU cores)")
    fig.tight_layout()
    with atomic_file.staged(path) as staging:
        fig.savefig(staging, dpi=120, format=Path(path).suffix.lstrip(".").lower() or "png")


def out_problem(path: str | None, plot: bool) -> str | None:
    """Why an output file cannot be written at `path` (None: it can, or none is asked for): a folder that does not
    exist, or a plot without matplotlib, was a traceback once every run had finished."""
    if path is None:
        return None
    target = Path(path)
    if target.is_dir():
        return f"{path} is a folder"
    if not target.resolve().parent.is_dir():
        return f"the folder {target.parent} does not exist"
    if plot and importlib.util.find_spec("matplotlib") is None:
        return "the plot needs matplotlib, which is not installed: pip install matplotlib"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=_sizes, default="50000,500000,2000000", help="hash-trace sizes in requests")
    ap.add_argument("--capacity-blocks", type=at_least(1), default=5000)
    ap.add_argument("--chat", type=at_least(0), default=0, help="also a `trace gen chat --count N` token trace")
    ap.add_argument("--workdir", default="/tmp/radixcache-bench-sim")
    ap.add_argument("--modes", type=_modes, default="streamed,in memory", help=f"from {', '.join(MODES)}")
    ap.add_argument("--belady-max", type=at_least(0), default=2_000_000, help="skip --belady on larger traces")
    ap.add_argument("--in-memory-max", type=at_least(0), default=500_000, help="skip --in-memory on larger traces")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--markdown", help="write the table here")
    ap.add_argument("--plot", help="write a PNG plot here")
    args = ap.parse_args()
    for option in ("json", "markdown", "plot"):  # checked before any trace is made: minutes of runs went before
        problem = out_problem(getattr(args, option), option == "plot")
        if problem is not None:
            ap.error(f"argument --{option}: {problem}")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    modes = args.modes
    jobs: list[tuple[str, Path, int, int | None]] = []
    for size in args.sizes:
        jobs.append((f"hash {size // 1000}k", hash_trace(workdir, size), size, 16))
    if args.chat:
        jobs.append((f"chat --count {args.chat}", chat_trace(workdir, args.chat), 0, None))
    rows: list[Row] = []
    for name, path, size, block in jobs:
        for run in RUNS:
            if run == "lru + belady" and (size > args.belady_max or not size):
                continue
            for mode in modes:
                in_memory = mode == "in memory"
                if in_memory and size > args.in_memory_max:
                    continue
                seconds, rss, out = measure(simulate_cmd(path, args.capacity_blocks, block, run, in_memory))
                row = Row(
                    name,
                    out["requests"],
                    run,
                    mode,
                    seconds,
                    rss,
                    out["hit_rate"],
                    out.get("belady_hit_rate"),
                )
                rows.append(row)
                print(f"{name} {row.run} {mode}: {seconds:.1f} s, {rss:.0f} MiB, hit rate {row.hit_rate:.4f}")
    print()
    print(table(rows))
    streamed = {(r.trace, r.run): r for r in rows if r.mode == "streamed"}
    for r in rows:
        s = streamed.get((r.trace, r.run))
        if r.mode == "in memory" and s is not None:
            print(
                f"{r.trace} {r.run}: streamed / in memory = {s.seconds / r.seconds:.2f}x time, "
                f"{s.peak_rss_mib / r.peak_rss_mib:.2f}x peak RSS; same hit rate: {s.hit_rate == r.hit_rate}"
            )
    if args.json:  # each written whole (radixcache.runtime.atomic_file): an earlier file is never left cut short
        atomic_file.write_bytes(args.json, json.dumps([asdict(r) for r in rows], indent=2).encode())
    if args.markdown:
        atomic_file.write_bytes(args.markdown, (table(rows) + "\n").encode())
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
