"""The sample replay over HTTP against `radixcache serve --replicas N`, once per router: hit rate and streaming TTFT.

    .venv/bin/python scripts/bench_routing_server.py                       # 2 replicas, cache_aware vs round_robin
    .venv/bin/python scripts/bench_routing_server.py --routers cache_aware,round_robin,least_loaded --replicas 2

Each router gets a fresh server (a local Ray cluster, N SmolLM2 replicas with cores / N torch threads each) and the
same conversations through the openai client (scripts/bench_server.py's clients: each conversation sends its turns in
order, streaming, with the replies appended). Prints one row per router and, against the first router, the hit rate
ratio and the TTFT p50 ratio of every other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

from bench_server import SAMPLE, bench, server_process, synthetic, table  # noqa: E402

from radixcache.trace.text import iter_conversations  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(SAMPLE), help="conversation JSONL [default: the sample], or 'synthetic'")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--routers", default="cache_aware,round_robin")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--kv-memory", default="128MiB", help="per replica")
    args = ap.parse_args()
    convs = synthetic(8, 4) if args.trace == "synthetic" else list(iter_conversations(args.trace))
    convs = convs[: args.limit] if args.limit else convs
    rows = []
    for router in args.routers.split(","):
        extra = ["--replicas", str(args.replicas), "--router", router, "--kv-memory", args.kv_memory]
        with server_process(args.model, extra, timeout=600) as (url, _proc):
            rows.append(bench(url, router, convs, args.concurrency, args.max_tokens, "bench"))
    print(
        f"{len(convs)} conversations, {args.concurrency} concurrent clients, {args.max_tokens} tokens per reply, "
        f"{args.replicas} replicas of {args.model}"
    )
    print(table(rows).replace("| cache |", "| router |").split("\nthroughput")[0])
    first = rows[0]
    for other in rows[1:]:
        hit = first.hit_rate / other.hit_rate if other.hit_rate else float("inf")
        print(
            f"{first.mode} vs {other.mode}: hit rate {hit:.2f}x, "
            f"TTFT p50 {other.ttft_p50 / first.ttft_p50:.2f}x lower, throughput {first.rps / other.rps:.2f}x"
        )


if __name__ == "__main__":
    main()
