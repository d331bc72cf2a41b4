"""Benchmark what a disk load costs the requests already running: a decoding request's inter-token gaps while another
request's long prefix (2,000 tokens by default) comes off the disk tier, against the same decode with nothing
loading, on SmolLM2.

    .venv/bin/python scripts/bench_tier_prefetch.py                  # SmolLM2 on the CPU, a few minutes on 2 cores
    .venv/bin/python scripts/bench_tier_prefetch.py --quick          # smaller sizes (a smoke run)

Each round opens an engine on a cache directory that holds the long prompt's pages (written by an earlier engine,
so they are on disk only: a restart), then runs the decode (`--decode-tokens` tokens of a short prompt) three ways:
- alone: nothing else arrives;
- disk: once the decode has made `--at` tokens, the long prompt arrives (max_new_tokens=1); its pages are read by
  the prefetch readers while the decode keeps stepping, then copied into the pool in one batched copy, then its
  last partial page is prefilled beside the decode;
- device: the same, with the long prompt now on the device (the disk run put it there): what admitting it costs
  the decode without any disk read (its last page's prefill, chunked with the decode);
- disk, unpaced (with `--pages-per-step` above 0): as "disk" on a fresh engine whose readers read as fast as they
  can beside the decode (`prefetch_pages_per_step=0`), as they did before the pace;
- disk, read on the loop: as "disk" on a fresh engine whose scheduler does not prefetch (its KV manager's
  `prefetch` answers "admit now" and starts nothing), so admission reads the pages itself, on the loop thread, as
  every disk read did before the prefetch readers (batched into one copy, as now): the stall they removed.
- disk / device with an attention bound: as "disk" and "device" on an engine whose scheduler bounds the attention
  work of a step's chunks beside decodes (`SchedulerConfig.mixed_prefill_attention`), once for each value of
  `--attention-budget` (query tokens x positions attended; over 2,000 cached positions 2048 lets 1 token a step,
  8192 4 and 16384 8): the long prompt's last chunk is cut over several steps.
- disk / device staged: the same with `SchedulerConfig.staged_prefill_attention` (model.staged), once for each value
  of `--staged`: the long prompt's last chunk runs its decoder layers over several steps beside the decode
  (over 2,000 cached positions, a 16-token chunk is about 32,000 of work: 8192 runs it in 4 steps of 8 layers).
The gaps from the long prompt's arrival to the decode's end are pooled over `--rounds` rounds (interleaved, so a
change in the machine's load touches every variant alike); prints p50 and p99 of each, against "alone", the long
prompt's median time to first token, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from script_args import at_least, number  # noqa: E402

if TYPE_CHECKING:
    from radixcache.runtime import Engine

# torch and the runtime are imported where they are used, after the arguments are checked: a bad count is refused
# at once, not after the seconds torch takes to import.


def _decode(
    engine: Engine, prompt: list[int], args: argparse.Namespace, other: list[int] | None, ttft: list[float]
) -> list[float]:
    """Run the decode; when it has made `args.at` tokens, submit `other` (if any; its time to first token goes to
    `ttft`). The gaps (seconds) between the decode's tokens from then on."""
    req = engine._request(prompt, args.decode_tokens, ignore_eos=True)
    times: list[float] = []
    reached = threading.Event()

    def listener(r: Any) -> None:  # on the engine loop thread, at each new token
        times.append(time.perf_counter())
        if len(r.output_ids) >= args.at:
            reached.set()

    req.listener = listener
    handle = engine._loop.submit(req)
    assert reached.wait(120)
    start = len(times)
    late = engine.submit(other, max_new_tokens=1) if other is not None else None
    handle.result(300)
    if late is not None:
        ttft.append(late.result(300).ttft_s)
    return [b - a for a, b in zip(times[start - 1 :], times[start:], strict=False)]


def _warm_up(engine: Engine, prompt: list[int], args: argparse.Namespace) -> None:
    """The first passes of a new engine (and thread) are slow; and the "alone" decode, measured first, took gaps of
    seconds in some rounds of earlier runs (p99 824 and 1,994 ms against 68 in another run), so each engine also
    rests `--settle` seconds before its first measured decode, to let what a new engine starts in the background
    finish."""
    for _ in range(2):
        engine.generate(prompt, max_new_tokens=args.decode_tokens // 2, ignore_eos=True)
    time.sleep(args.settle)


def measure(model: Any, args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    from tier_bench_kit import fixed_threads, random_prompt

    from radixcache.runtime import Engine
    from radixcache.runtime.engine.scheduler import SchedulerConfig

    vocab = model.config.vocab_size
    long_prompt = random_prompt(vocab, args.prefix_tokens, 7)
    short = random_prompt(vocab, 48, 8)
    p = args.page_size
    blocks = -(-(args.prefix_tokens + args.decode_tokens + 64) // p) * 2
    common = {
        "page_size": p,
        "device": args.device,
        "capacity_blocks": blocks,
        "prefetch_pages_per_step": args.pages_per_step,
        **fixed_threads(),
    }
    options = [("bound", w, SchedulerConfig(mixed_prefill_attention=w)) for w in args.attention_budget]
    options += [("staged", w, SchedulerConfig(staged_prefill_attention=w)) for w in args.staged]
    bounded = [f"{kind}_{name}{w}" for name, w, _ in options for kind in ("disk", "device")]
    unpaced = ["disk_unpaced"] if args.pages_per_step else []
    gaps: dict[str, list[float]] = {k: [] for k in ("alone", "disk", "device", *unpaced, *bounded, "sync")}
    ttft: dict[str, list[float]] = {k: [] for k in gaps}
    disk_pages = []
    with tempfile.TemporaryDirectory() as cache_dir:
        with Engine(model, cache_dir=cache_dir, **common) as writer:
            writer.generate(long_prompt, max_new_tokens=1)
            assert writer.flush(120)
        for _ in range(args.rounds):
            with Engine(model, cache_dir=cache_dir, **common) as engine:
                _warm_up(engine, short, args)
                gaps["alone"] += _decode(engine, short, args, None, ttft["alone"])
                gaps["disk"] += _decode(engine, short, args, long_prompt, ttft["disk"])
                disk_pages.append(engine.stats.tiers.disk_loaded_pages)
                gaps["device"] += _decode(engine, short, args, long_prompt, ttft["device"])
            if unpaced:
                with Engine(model, cache_dir=cache_dir, **common | {"prefetch_pages_per_step": 0}) as engine:
                    _warm_up(engine, short, args)
                    gaps["disk_unpaced"] += _decode(engine, short, args, long_prompt, ttft["disk_unpaced"])
                    disk_pages.append(engine.stats.tiers.disk_loaded_pages)
            for name, w, config in options:
                with Engine(model, cache_dir=cache_dir, scheduler_config=config, **common) as engine:
                    _warm_up(engine, short, args)
                    for kind in ("disk", "device"):  # the first run reads the disk and leaves the prefix on the device
                        key = f"{kind}_{name}{w}"
                        gaps[key] += _decode(engine, short, args, long_prompt, ttft[key])
                        if kind == "disk":
                            disk_pages.append(engine.stats.tiers.disk_loaded_pages)
            with Engine(model, cache_dir=cache_dir, **common) as engine:
                engine.kv.prefetch = lambda kv, query: True  # the old path: admission reads the disk on the loop
                _warm_up(engine, short, args)
                gaps["sync"] += _decode(engine, short, args, long_prompt, ttft["sync"])
                disk_pages.append(engine.stats.tiers.disk_loaded_pages)
    assert all(n >= args.prefix_tokens // p - 1 for n in disk_pages), f"the disk run loaded {disk_pages} pages"
    return gaps, ttft


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.1f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--page-size", type=at_least(1), default=16)
    parser.add_argument("--prefix-tokens", type=at_least(1), default=2000)
    parser.add_argument("--decode-tokens", type=at_least(1), default=48)
    parser.add_argument("--at", type=at_least(0), default=8, help="decode tokens made before the long prompt arrives")
    parser.add_argument("--rounds", type=at_least(1), default=5)
    parser.add_argument("--threads", type=at_least(1), help="torch threads")
    parser.add_argument(
        "--attention-budget",
        type=at_least(1),
        nargs="*",
        default=[2048, 8192, 16384],
        help="mixed_prefill_attention of the bounded variants, one pair each (query tokens x positions attended per "
        "step; none: no bounded variant)",
    )
    parser.add_argument(
        "--staged",
        type=at_least(1),
        nargs="*",
        default=[8192],
        help="staged_prefill_attention of the staged variants, one pair each (none: no staged variant)",
    )
    parser.add_argument(
        "--pages-per-step",
        type=at_least(0),
        default=16,
        help="Engine(prefetch_pages_per_step=): page reads the readers start per step beside decodes (0: unpaced; "
        "with a value, an unpaced disk variant runs too)",
    )
    parser.add_argument(
        "--settle", type=number(0, 3600), default=2.0, help="seconds each engine rests after its warm-up"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.quick:
        args.prefix_tokens, args.decode_tokens, args.rounds = 400, 24, 2
    if args.at >= args.decode_tokens:  # the long prompt would never be sent: the decode's wait failed after 120 s
        parser.error(f"argument --at: expected fewer than --decode-tokens ({args.decode_tokens}), got {args.at}")
    import torch

    from radixcache.runtime.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model)
    gaps, ttft = measure(model, args)
    alone99 = _pct(gaps["alone"], 0.99)
    lines = [
        f"SmolLM2 ({args.model}), {args.device}, {torch.get_num_threads()} threads, pages of {args.page_size} "
        f"tokens; a decode's inter-token gaps while a {args.prefix_tokens}-token prefix arrives "
        f"({args.rounds} interleaved rounds, gaps pooled)",
        "",
        "| the decode, while | gaps | p50 ms | p90 ms | p99 ms | p99 / alone | the long prompt's TTFT, median ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    labels = {
        "alone": "nothing arrives",
        "disk": f"the prefix loads from disk (prefetch readers, {args.pages_per_step or 'unpaced'} pages a step)",
        **({"disk_unpaced": "the prefix loads from disk (prefetch readers, unpaced)"} if args.pages_per_step else {}),
        "device": "the prefix hits the device",
        **{
            f"{kind}_bound{w}": f"the prefix {what}, attention bound {w}"
            for w in args.attention_budget
            for kind, what in (("disk", "loads from disk"), ("device", "hits the device"))
        },
        **{
            f"{kind}_staged{w}": f"the prefix {what}, staged by layers over {w}"
            for w in args.staged
            for kind, what in (("disk", "loads from disk"), ("device", "hits the device"))
        },
        "sync": "the prefix loads from disk, read on the loop (before)",
    }
    for key, label in labels.items():
        g = gaps[key]
        p99 = _pct(g, 0.99)
        lines.append(
            f"| {label} | {len(g)} | {statistics.median(g) * 1e3:.1f} | {_pct(g, 0.9) * 1e3:.1f} "
            f"| {p99 * 1e3:.1f} | {p99 / alone99:.2f}x | {_median_ms(ttft[key])} |"
        )
    load = os.getloadavg()
    lines.append(f"\nload average (1, 5, 15 min) at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"gaps": gaps, "ttft": ttft, "args": vars(args)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
