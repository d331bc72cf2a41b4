"""Write a synthetic Mooncake-format hash-block trace of any size, in constant memory.

The shape follows the public Mooncake traces: each request's hash ids are the chain of its prompt blocks; requests
of one session extend that session's previous prompt (its history) with new blocks; sessions open on one of a few
hundred shared system prompts; timestamps only grow. About 30 hash ids per request, so 500,000 requests hold
about 15 million hash ids. Only the live sessions are in memory, never the trace.

    .venv/bin/python scripts/gen_hash_trace.py /tmp/hash500k.jsonl --requests 500000 --block-size 16
"""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path

import orjson
from script_args import at_least

from radixcache.cli.trace import staged


def write_hash_trace(
    path: str | Path,
    requests: int,
    *,
    block_size: int = 16,
    seed: int = 0,
    live_sessions: int = 2000,
    system_prompts: int = 300,
    rate_per_s: float = 50.0,
) -> int:
    """Write `requests` records to `path`; returns the number of hash ids written. ValueError for a count or block
    size below 1 (a block size of 0 failed inside the generator, and -1 requests wrote an empty file)."""
    for name, value in (("requests", requests), ("block_size", block_size)):
        if type(value) is not int or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    rng = random.Random(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    prompts = [fresh(rng.randint(2, 24)) for _ in range(system_prompts)]
    sessions: list[list[int]] = []
    clock_ms = 0.0
    written = 0
    # Written beside `path` and moved onto it once whole: an interrupted run leaves no shorter trace at `path`, which
    # scripts/bench_simulator.py (it keeps its traces between runs) would take for the whole one.
    with staged(os.fspath(path)) as staging, open(staging, "wb") as out:
        for _ in range(requests):
            clock_ms += rng.expovariate(rate_per_s) * 1000.0
            if not sessions or (len(sessions) < live_sessions and rng.random() < 0.35):
                history = list(prompts[min(int(rng.paretovariate(1.2)) - 1, system_prompts - 1)])
                sessions.append(history)
            else:
                history = sessions[rng.randrange(len(sessions))]
            ids = history + fresh(rng.randint(1, 8))
            if len(ids) > 64 or rng.random() < 0.1:  # the session ends: a new one takes its slot
                sessions.remove(history)
            else:
                history[:] = ids + fresh(rng.randint(0, 2))  # the reply joins the next turn's prompt
            input_length = len(ids) * block_size - rng.randrange(block_size)
            record = {
                "timestamp": round(clock_ms),
                "input_length": input_length,
                "output_length": rng.randint(1, 400),
                "hash_ids": ids,
            }
            out.write(orjson.dumps(record) + b"\n")
            written += len(ids)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--requests", type=at_least(1), default=500_000)
    ap.add_argument("--block-size", type=at_least(1), default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ids = write_hash_trace(args.out, args.requests, block_size=args.block_size, seed=args.seed)
    print(f"{args.out}: {args.requests:,} requests, {ids:,} hash ids, block size {args.block_size}")


if __name__ == "__main__":
    main()
