"""What constrained decoding costs: decode throughput of the same requests with and without a JSON schema.

    python scripts/bench_structured.py [--model smollm2] [--batches 1,8] [--tokens 64] [--rounds 5] [--json FILE]

Each request is one chat prompt asking for people as JSON; constrained, it runs under a `json_schema`
response_format (a list of at least 50 people with a name, an age and a city, so no output ends before
`--tokens`); unconstrained, the same prompt with `ignore_eos`. Both decode exactly `--tokens` greedy tokens, so
the two arms do the same model work and differ only by the grammar: the per-request GrammarState (compiled in the
caller's thread, once, then cached), the masks of each step and their application to the logits.

At each batch size the B requests (distinct prompts) are queued together behind a hold of the engine loop, and
the decode throughput is the generated tokens after each request's first, over the time from the last first token
to the last result (prefill excluded). Rounds interleave the arms (constrained first in odd rounds), after one
warm-up round of each; the table gives each arm's median and the ratio constrained / unconstrained.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixcache.runtime.engine.engine import Engine
from radixcache.runtime.testing import hold_engine_loop

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "minItems": 50,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "city": {"type": "string", "maxLength": 20},
                },
                "required": ["name", "age", "city"],
            },
        }
    },
    "required": ["people"],
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "people", "schema": SCHEMA, "strict": True}}
TOPICS = ("scientists", "painters", "sailors", "chefs", "poets", "runners", "bakers", "pilots", "gardeners")


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"List famous {TOPICS[i % len(TOPICS)]} ({i}) as JSON with name, age, city."}]


def run_batch(engine: Engine, batch: int, tokens: int, constrained: bool) -> float:
    """Decode tokens per second of `batch` requests queued together."""
    kw: dict[str, Any] = {"response_format": RESPONSE_FORMAT} if constrained else {"ignore_eos": True}
    release = hold_engine_loop(engine)
    try:
        handles = [engine.submit(engine._builder.render(messages(i)), tokens, **kw) for i in range(batch)]
    finally:
        release()
    results = [h.result(600) for h in handles]
    assert all(len(r.token_ids) == tokens for r in results), [len(r.token_ids) for r in results]
    span = max(r.latency_s for r in results) - max(r.ttft_s for r in results)  # they arrive within a millisecond
    return sum(len(r.token_ids) - 1 for r in results) / span


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    engine = Engine(args.model, threads=args.threads, enable_cache=False)  # no cache: every round computes alike
    rows = []
    print(f"model {args.model}, {args.tokens} tokens, {args.rounds} rounds, load average {os.getloadavg()[0]:.2f}")
    for batch in (int(b) for b in args.batches.split(",")):
        for constrained in (True, False):  # warm-up: the grammar's compile and lazy tables, the kernels
            run_batch(engine, batch, args.tokens, constrained)
        tps: dict[bool, list[float]] = {True: [], False: []}
        for rnd in range(args.rounds):
            for constrained in (rnd % 2 == 1, rnd % 2 == 0):
                tps[constrained].append(run_batch(engine, batch, args.tokens, constrained))
        free, con = statistics.median(tps[False]), statistics.median(tps[True])
        rows.append({"batch": batch, "unconstrained_tps": free, "constrained_tps": con, "ratio": con / free})
        print(f"batch {batch}: unconstrained {free:.1f} tok/s, constrained {con:.1f} tok/s, ratio {con / free:.3f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("\n| batch | unconstrained tok/s | json_schema tok/s | constrained / unconstrained |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['unconstrained_tps']:.1f} | {r['constrained_tps']:.1f} | {r['ratio']:.3f} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1))
    engine.close()


if __name__ == "__main__":
    main()
