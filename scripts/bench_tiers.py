"""Benchmark the host and disk tiers on SmolLM2: what a page costs to load from each tier against recomputing it, and
the time to first token of a long prompt served cold, from the device, from the host and from disk after a restart.

    .venv/bin/python scripts/bench_tiers.py                       # SmolLM2 on the CPU, a minute or two on 2 cores
    .venv/bin/python scripts/bench_tiers.py --quick               # smaller sizes (a smoke run)
    .venv/bin/python scripts/bench_tiers.py --device cuda --markdown out.md --json out.json

Measured, each baseline in the same run:
- costs: the prefill cost per token (a cold prompt of `--prompt-tokens`, max_new_tokens=1, best of `--reps`), and
  per page of `--page-size` tokens: a device -> host copy (HostKVPool.save), a host -> device copy (HostKVPool.load),
  and a disk read into the pool (the prefetch reader's path on one thread: DiskStore.read, checksum and token check
  included, into staging memory, then one batched copy; the files were just written, so the OS page cache holds
  them: a warm read). Prints each load cost against recomputing the page's
  tokens. These are the defaults of `radixcache simulate`'s cost flags (radixcache.sim.tiers.TierCosts).
- ttft: one prompt of `--prompt-tokens` (its last page partial), max_new_tokens=1: cold (no cache), all on the
  device, loaded from the host (the device pool evicted it: write_through kept a host copy), and loaded from disk by
  a new engine on the same cache directory (its reader threads prefetch the pages, the default `timeout` policy
  admits it when they are in). The four are measured in turn in each of `--rounds` rounds; prints the medians,
  each against the device hit and cold against each, and the load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from script_args import at_least  # noqa: E402

# torch and the runtime are imported where they are used, after the arguments are checked: a bad count is refused
# at once, not after the seconds torch takes to import.


def _best(fn: Any, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_costs(model: Any, args: argparse.Namespace) -> dict[str, float]:
    """Seconds: prefill per token; per page: host save, host load, disk read + load."""
    import torch
    from tier_bench_kit import fixed_threads, random_prompt

    from radixcache.runtime import Engine
    from radixcache.runtime.kv.tier.disk_store import DiskStore
    from radixcache.runtime.kv.tier.host_pool import HostKVPool
    from radixcache.runtime.kv.tier.page_copy import copy_staged
    from radixcache.runtime.kv.tier.prefetch import PrefetchReader
    from radixcache.runtime.kv.tier.prefetch_job import PrefetchJob

    p, n = args.page_size, args.prompt_tokens
    vocab = model.config.vocab_size
    cold = Engine(model, enable_cache=False, kv_memory="256MiB", page_size=p, device=args.device, **fixed_threads())
    with cold:
        cold.generate(random_prompt(vocab, 32, 0), max_new_tokens=1)  # warm-up
        seeds = iter(range(1, 10_000))
        prefill = _best(lambda: cold.generate(random_prompt(vocab, n, next(seeds)), max_new_tokens=1), args.reps) / n
        pool = cold.pool
        pages = min(args.pages, pool.num_blocks)
        blocks = list(range(pages))
        host = HostKVPool(pool, pages)
        slots = list(range(pages))
        save = _best(lambda: host.save(pool, blocks, slots), args.reps) / pages
        sync = torch.cuda.synchronize if pool.device.type == "cuda" else (lambda: None)

        def load() -> None:
            host.load(pool, slots, blocks)
            sync()

        host_load = _best(load, args.reps) / pages
        with tempfile.TemporaryDirectory() as tmp:
            store = DiskStore(tmp, max_bytes=1 << 40)
            meta = {"dtype": str(pool.dtype), "shape": list(pool.kv[:, :, 0].shape)}
            keys = [i.to_bytes(16, "little") for i in range(pages)]
            tokens = [list(range(i * p, (i + 1) * p)) for i in range(pages)]
            for i in range(pages):
                payload = pool.kv[:, :, i].contiguous().cpu().view(torch.uint8).numpy().tobytes()
                store.put(keys[i], tokens[i], payload, meta)
            store.flush()

            reader = PrefetchReader(store, pool)

            def read_all() -> None:  # one thread reads every page into staging, then one batched copy
                job = PrefetchJob(0, keys, tokens, [])
                got, staging = reader.read_now(job)
                assert got == pages and staging is not None
                copy_staged(pool, staging, got, blocks)
                sync()
                reader.release(job)  # its staging is kept for the next read, as an engine's is

            disk_load = _best(read_all, args.reps) / pages
            store.close()
    return {"prefill_s_per_token": prefill, "host_save_s": save, "host_load_s": host_load, "disk_load_s": disk_load}


def measure_ttft(model: Any, args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds to the first token of one long prompt, per round: cold, device hit, host hit, disk hit after a
    restart. The four are measured one after another in each of `--rounds` rounds (interleaved, so that a change
    in the machine's load touches them alike); the report takes medians."""
    from tier_bench_kit import fixed_threads, random_prompt

    from radixcache.runtime import Engine

    p, n = args.page_size, args.prompt_tokens
    vocab = model.config.vocab_size
    prompt = random_prompt(vocab, n, 123)
    filler = [random_prompt(vocab, n, 1000 + i) for i in range(3)]
    pages = -(-(n + 8) // p)
    host = 4 * pages * p * model.config.kv_bytes_per_token(4)
    out: dict[str, list[float]] = {"cold": [], "device": [], "host": [], "disk": []}
    with tempfile.TemporaryDirectory() as cache_dir:
        common = {"page_size": p, "device": args.device, "capacity_blocks": pages + 2, **fixed_threads()}
        # One engine alive at a time: an idle engine's thread team would compete with the one measured.
        for i in range(args.rounds):
            with Engine(model, enable_cache=False, **common) as cold:
                cold.generate(filler[0][:32], max_new_tokens=1)  # one-off start-up costs, as every engine below
                out["cold"].append(cold.generate(prompt, max_new_tokens=1).ttft_s)
            with Engine(model, host_kv_memory=host, cache_dir=cache_dir, **common) as engine:
                engine.generate(filler[1][:32], max_new_tokens=1)
                engine.generate(prompt, max_new_tokens=1)  # computed (round 0) or loaded from disk: now on the device
                out["device"].append(engine.generate(prompt, max_new_tokens=1).ttft_s)
                engine.generate(filler[i % len(filler)], max_new_tokens=1)  # evicts the prompt from the device
                loaded = engine.stats.tiers.host_loaded_pages
                out["host"].append(engine.generate(prompt, max_new_tokens=1).ttft_s)
                assert engine.stats.tiers.host_loaded_pages > loaded, "the host hit loaded nothing"
                assert engine.flush(120)
            with Engine(model, cache_dir=cache_dir, **common) as restarted:
                restarted.generate(filler[1][:32], max_new_tokens=1)
                out["disk"].append(restarted.generate(prompt, max_new_tokens=1).ttft_s)
                assert restarted.stats.tiers.disk_loaded_pages > 0, "the disk hit loaded nothing"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--page-size", type=at_least(1), default=16)
    parser.add_argument("--prompt-tokens", type=at_least(1), default=600)
    parser.add_argument("--pages", type=at_least(1), default=64, help="pages per load measurement")
    parser.add_argument("--reps", type=at_least(1), default=3, help="best of this many, per cost")
    parser.add_argument("--rounds", type=at_least(1), default=5, help="interleaved TTFT rounds (medians reported)")
    parser.add_argument("--threads", type=at_least(1), help="torch threads")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.quick:
        args.prompt_tokens, args.pages, args.reps, args.rounds = 128, 16, 2, 2
    import torch

    from radixcache.runtime.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model)
    costs = measure_costs(model, args)
    ttft = measure_ttft(model, args)
    p = args.page_size
    recompute = costs["prefill_s_per_token"] * p
    lines = [
        f"SmolLM2 ({args.model}), {args.device}, {torch.get_num_threads()} threads, pages of {p} tokens, "
        f"prompt {args.prompt_tokens} tokens",
        "",
        "| cost per page | ms | recompute / this |",
        "|---|---:|---:|",
        f"| recompute (prefill, {costs['prefill_s_per_token'] * 1e3:.3f} ms per token) "
        f"| {recompute * 1e3:.3f} | 1.00x |",
    ]
    for label, key in (
        ("device -> host copy", "host_save_s"),
        ("host -> device load", "host_load_s"),
        ("disk read + load (warm)", "disk_load_s"),
    ):
        lines.append(f"| {label} | {costs[key] * 1e3:.3f} | {recompute / costs[key]:.1f}x |")
    med = {label: statistics.median(runs) for label, runs in ttft.items()}
    lines += [
        "",
        f"| TTFT of the prompt (median of {args.rounds} interleaved rounds) | ms | this / device hit | cold / this |",
        "|---|---:|---:|---:|",
    ]
    for label in ("cold", "device", "host", "disk"):
        ratio = med[label] / med["device"]
        lines.append(f"| {label} | {med[label] * 1e3:.1f} | {ratio:.2f}x | {med['cold'] / med[label]:.2f}x |")
    load = os.getloadavg()
    lines.append(f"\nload average (1, 5, 15 min) at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}")
    text = "\n".join(lines)
    print(text)
    scale = 16 / p  # the simulator's per-page costs are per page of 16 tokens
    print(
        "\nsimulate defaults (per 16-token page): "
        f"--prefill-ms-per-token {costs['prefill_s_per_token'] * 1e3:.3f} "
        f"--host-load-ms-per-page {costs['host_load_s'] * 1e3 * scale:.3f} "
        f"--disk-load-ms-per-page {costs['disk_load_s'] * 1e3 * scale:.3f}"
    )
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"costs": costs, "ttft": ttft, "args": vars(args)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
