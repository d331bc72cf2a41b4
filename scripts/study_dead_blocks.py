"""How much of the LRU -> Belady gap predicting dead blocks can close, on a hash trace (issue 17's study).

For each capacity (a share of the trace's unique blocks) it replays:
- lru, belady (resident), lru-dead (LRU told every dead block: a perfect dead-block predictor) and reuse;
- fresh-dead: LRU told which blocks are dead only for leaves no request has hit yet (what a predictor of first
  reuse could know at best);
- output-class: LRU that evicts first the leaves of requests whose output-length class (log2 of output_length) is
  mostly dead, and a request's last block (the partial one). The classes are calibrated on the trace itself, so
  this is an upper bound for a predictor built on that feature, not a policy that could run online.

It prints hit rates and each run's share of the gap. Usage:
    .venv/bin/python scripts/study_dead_blocks.py ../shared/traces/mooncake_synthetic_trace.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from script_args import number

from radixcache.node import TreeNode
from radixcache.policy.base import EvictionPolicy
from radixcache.sim.cache_replay import CacheReplay
from radixcache.sim.oracle import ChainedNextUseOracle, DeadBlockLRU, NextUseOracle
from radixcache.sim.simulation import simulate
from radixcache.sim.sweep import capacities_for, study_fractions, study_workload
from radixcache.trace.workload import Workload


class FreshDeadLRU(DeadBlockLRU):
    """lru-dead, except that a leaf hit at least once is never called dead."""

    name = "fresh-dead"

    def priority(self, node: TreeNode) -> tuple:
        return self.priority_at(node, len(node.blocks))

    def priority_at(self, node: TreeNode, blocks: int) -> tuple:
        dead = self.oracle.next_use_of_block(node.blocks[blocks - 1]) >= self.oracle.never
        return (not dead or node.hit_count > 0, node.last_access)


class OutputClassLRU(EvictionPolicy):
    """LRU with a first tier: leaves of a mostly-dead output class, and a request's last block."""

    name = "output-class"
    ranks_by_extent = True
    trims_in_bulk = True

    def __init__(self, dead_classes: set[int], last_blocks: set[int], threshold: float) -> None:
        self.dead_classes, self.last_blocks, self.threshold = dead_classes, last_blocks, threshold
        self.groups: dict[int, int] = {}  # a leaf's creation time -> its request's output class
        self.expected = -1

    def expect(self, output_tokens: int | None) -> None:
        self.expected = -1 if output_tokens is None else int(output_tokens).bit_length()

    def priority(self, node: TreeNode) -> tuple:
        return self.priority_at(node, len(node.blocks))

    def priority_at(self, node: TreeNode, blocks: int) -> tuple:
        klass = self.groups.get(node.created)
        if klass is None:
            fresh = node.created == node.last_access and node.hit_count == 0
            klass = self.groups[node.created] = self.expected if fresh else -1
            if fresh:
                self.expected = -1
        if node.hit_count == 0 and int(node.key[blocks - 1]) in self.last_blocks:
            return (0, node.last_access)
        return (1 + (node.hit_count > 0 or klass not in self.dead_classes), node.last_access)


def output_classes(path: str, threshold: float) -> tuple[set[int], set[int]]:
    """The output classes whose first-time blocks (last block aside) are reused less than `threshold` of the
    time, and every request's last block."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    uses = collections.Counter(h for line in lines for h in line["hash_ids"])
    seen: set[int] = set()
    counts: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
    for line in lines:
        ids = line["hash_ids"]
        klass = int(line.get("output_length") or 0).bit_length()
        for h in ids[:-1]:
            if h not in seen:
                seen.add(h)
                counts[klass][0] += 1
                counts[klass][1] += uses[h] > 1
        seen.update(ids[-1:])
    dead = {k for k, (n, reused) in counts.items() if reused < threshold * n}
    return dead, {line["hash_ids"][-1] for line in lines if line["hash_ids"]}


def with_oracle(workload: Workload, capacity: int, policy: EvictionPolicy, oracle: object | None) -> float:
    """A replay whose policy is an instance that may read Belady's oracle (which the replay then keeps current)."""
    replay = CacheReplay(workload, capacity, policy)
    replay.oracle = oracle  # the replay moves the oracle's clock and assigns its blocks, as for lru-dead
    for index, request in enumerate(workload):
        replay.feed(index, request)
    replay.close()
    return replay.result().hit_rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a Mooncake-format hash trace")
    ap.add_argument("--fractions", default="0.02,0.05,0.1,0.2", help="capacities as shares of the unique blocks")
    ap.add_argument("--block-size", type=int, default=512)
    ap.add_argument("--threshold", type=number(0, 1), default=0.2, help="an output class is dead below this reuse rate")
    args = ap.parse_args()
    fractions = study_fractions(ap, args)
    workload = study_workload(ap, args)
    dead_classes, last_blocks = output_classes(args.trace, args.threshold)
    print(f"dead output classes (log2 of output_length): {sorted(dead_classes)}")
    print("| capacity | lru | belady | lru-dead | fresh-dead | output-class | reuse |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for capacity in capacities_for(workload, fractions):
        rates = {name: simulate(workload, capacity, name).hit_rate for name in ("lru", "belady", "lru-dead", "reuse")}
        # The flat oracle takes chained ids only; any other hash trace (a recorded one) needs the trie's, as the
        # simulator's own Belady replay falls back to (None was an AttributeError inside the replay).
        oracle = ChainedNextUseOracle.build(workload, capacity) or NextUseOracle(workload, capacity)
        rates["fresh-dead"] = with_oracle(workload, capacity, FreshDeadLRU(oracle), oracle)  # type: ignore[arg-type]
        policy = OutputClassLRU(dead_classes, last_blocks, args.threshold)
        rates["output-class"] = with_oracle(workload, capacity, policy, None)
        names = ("lru-dead", "fresh-dead", "output-class", "reuse")
        row = [f"{rates['lru'] * 100:.2f}%", f"{rates['belady'] * 100:.2f}%", *(_cell(rates, n) for n in names)]
        print(f"| {capacity} | " + " | ".join(row) + " |")


def _cell(rates: dict[str, float], name: str) -> str:
    """A hit rate with its share of the LRU -> Belady gap."""
    gap = rates["belady"] - rates["lru"]
    share = (rates[name] - rates["lru"]) / gap if gap > 0 else 0.0
    return f"{rates[name] * 100:.2f}% ({share * 100:+.0f}%)"


if __name__ == "__main__":
    main()
