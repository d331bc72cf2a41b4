"""Compare eviction policies, with and without leases, on generated agent traces and on chat/Mooncake traces.

    python scripts/simulate_agents.py --seeds 10 11 12 --capacity 400 [--budget 0.5] [--trace PATH ...]

For each agent seed (radixcache.trace.agent_sessions, 8 agents, 2-30 s log-uniform pauses) it replays lru,
reuse, tlru and agent three ways: without hints, with the hints told to the policy only (budget 0: nothing is held),
and with leases (radixcache.sim.lease_replay, `--budget` of capacity: pages held, hints told), plus
the belady and belady-admission bounds (no leases); it prints the mean hit rate and the mean modelled TTFT p99
over the seeds, and each one's ratio to LRU without leases. Each `--trace` (a JSONL/msgpack/Mooncake trace read
by radixcache.trace.workload.load_workload) and `--chat-seeds` (radixcache's `trace gen chat`) is replayed by every
online policy without hints and reported as points against LRU.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Sequence

from radixcache.errors import RadixCacheError
from radixcache.sim.lease_replay import LeaseReplay
from radixcache.sim.simulation import simulate
from radixcache.trace.agent_sessions import agent_sessions
from radixcache.trace.synthetic import multi_turn_chat
from radixcache.trace.workload import Workload, load_workload, token_workload

ONLINE = ("lru", "reuse", "tlru", "agent")
BOUNDS = ("belady", "belady-admission")


def run(workload: Workload, capacity: int, policy: str, hints: Sequence[float | None], budget: float) -> tuple:
    """(hit rate, TTFT p99 ms) of one lease replay."""
    replay = LeaseReplay(workload, capacity, policy, hints, budget=budget)
    for index, request in enumerate(workload.requests):
        replay.feed(index, request)
    replay.close()
    return replay.result().hit_rate, replay.ttft_p99_ms()


def agent_table(seeds: Sequence[int], capacity: int, budget: float, page: int) -> list[tuple[str, float, float]]:
    rows: dict[str, list[tuple[float, float]]] = {}
    for seed in seeds:
        requests = list(agent_sessions(seed=seed))
        workload = token_workload(requests, page_size=page)
        hints = [request.retain_for for request in requests]
        none = [None] * len(requests)  # not (): past the end of its hints a replay reads each request's own
        for policy in ONLINE:
            rows.setdefault(f"{policy}", []).append(run(workload, capacity, policy, none, 0.0))
            rows.setdefault(f"{policy}+hint", []).append(run(workload, capacity, policy, hints, 0.0))
            rows.setdefault(f"{policy}+lease", []).append(run(workload, capacity, policy, hints, budget))
        for bound in BOUNDS:
            rows.setdefault(bound, []).append(
                (simulate(workload, capacity, bound, honor_timestamps=True).hit_rate, None)
            )
    return [(name, statistics.mean(h for h, _ in v), _mean_ttft([t for _, t in v])) for name, v in rows.items()]


def _mean_ttft(ttfts: list[float | None]) -> float | None:
    """The mean modelled TTFT p99 over the seeds; None for a bound, which has no TTFT model (printed "-")."""
    return None if None in ttfts else statistics.mean(ttfts)


def points_under_lru(workload: Workload, capacity: int) -> dict[str, float]:
    """Each online policy's hit rate minus LRU's, in points, without hints."""
    none = [None] * len(workload.requests)  # hints of its own that a trace carries are not told either
    base = run(workload, capacity, "lru", none, 0.0)[0]
    return {policy: 100 * (run(workload, capacity, policy, none, 0.0)[0] - base) for policy in ONLINE}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[10, 11, 12])
    parser.add_argument("--capacity", type=_positive, default=400, help="cache pages")
    parser.add_argument("--page-size", type=_positive, default=16)
    parser.add_argument("--budget", type=_fraction, default=0.5, help="lease budget, a fraction of capacity")
    parser.add_argument("--chat-seeds", type=int, nargs="*", default=[0])
    parser.add_argument("--trace", nargs="*", default=[])
    parser.add_argument("--trace-capacity", type=_positive, default=2000, help="pages (blocks) for --trace and chat")
    args = parser.parse_args(argv)
    missing = [path for path in args.trace if not os.path.isfile(path)]
    if missing:  # refused before the replays: a bad value was a traceback after the agent table, minutes in
        parser.error(f"--trace: no such trace file: {', '.join(missing)}")
    try:  # read before the replays too: an empty or malformed trace was a TraceError traceback after the table
        traces = [(path, load_workload(path)) for path in args.trace]
    except RadixCacheError as exc:
        parser.error(f"--trace: {exc}")
    table = agent_table(args.seeds, args.capacity, args.budget, args.page_size)
    lru_hit, lru_ttft = next((h, t) for n, h, t in table if n == "lru")
    print(f"agent traces, seeds {args.seeds}, {args.capacity} pages of {args.page_size}, budget {args.budget}")
    print("| policy | hit rate | vs LRU | TTFT p99 (ms) | vs LRU |")
    print("|---|---|---|---|---|")
    for name, hit, ttft in table:
        shown, ratio = ("-", "-") if ttft is None else (f"{ttft:.0f}", f"{ttft / lru_ttft:.3f}" if lru_ttft else "-")
        print(f"| {name} | {hit:.4f} | {hit / lru_hit:.3f} | {shown} | {ratio} |")
    for seed in args.chat_seeds:
        workload = token_workload(multi_turn_chat(seed=seed, conversations=200), page_size=args.page_size)
        print(f"chat seed {seed}: points vs LRU", _fmt(points_under_lru(workload, args.trace_capacity)))
    for path, workload in traces:
        print(f"{path}: points vs LRU", _fmt(points_under_lru(workload, args.trace_capacity)))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text}")
    return value


def _fmt(points: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:+.2f}" for k, v in points.items())


if __name__ == "__main__":
    main()
