"""Insertion rules that help LRU on some traces, measured on a hash trace (issue 17's study, continued).

Each gives some new leaves a lower rank than LRU would, and leaves every leaf that has been hit to LRU:
- bip-K (bimodal insertion): a leaf never hit goes before every other leaf, except the leaves of one insert in
  K (picked by a hash of the insert's clock, so an insert keeps its pick as it is split). Against a loop larger
  than the cache, this keeps a fixed share of it long enough to be read again. K=1 is LRU.
- new-root-H: a never-hit leaf of an insert that hung from the root (its request hit nothing: a new document or
  the first turn of a conversation) ranks as if accessed H ticks earlier (H="inf": before every other leaf).
  On Mooncake most such requests are never followed up.
- new-root-H-ghosts: the same, except for a request whose first page the cache has seen before (a set of every
  first page key, a ghost list without a bound): its content comes back, so its pages rank as LRU ranks them.

First it prints the trace's shape that decides how these rules fare: the distances of its re-reads (distinct blocks
read between two reads of a block, each request's path read deepest block first, as LRU stamps it) and how many
requests read each first block. Then, for each capacity (a share of the trace's unique blocks), LRU, Belady
(resident) and each rule's hit rate with its share of the LRU -> Belady gap. Usage:
    .venv/bin/python scripts/study_insertion.py ../shared/traces/mooncake_synthetic_trace.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
import math
from pathlib import Path

import numpy as np

from radixcache.node import TreeNode
from radixcache.policy.base import EvictionPolicy
from radixcache.sim.simulation import simulate
from radixcache.sim.sweep import capacities_for, study_fractions, study_workload


class BimodalInsertion(EvictionPolicy):
    """LRU, except that never-hit leaves go first unless their insert is one of the `keep_one_in` kept."""

    name = "bip"

    def __init__(self, keep_one_in: int) -> None:
        self.keep_one_in = keep_one_in

    def priority(self, node: TreeNode) -> tuple:
        kept = (node.created * 2654435761) % 1000003 % self.keep_one_in == 0  # a fixed pick per insert
        return (node.hit_count > 0 or kept, node.last_access)


class NewRootLater(EvictionPolicy):
    """LRU, except that a never-hit leaf of an insert that hung from the root ranks `offset` ticks older."""

    name = "new-root"

    def __init__(self, offset: float, ghosts: bool = False) -> None:
        self.offset, self.ghosts = offset, ghosts
        self.new_root: dict[int, bool] = {}  # an insert's clock -> whether its leaf hung from the root (and is new)
        self.first_pages: set[object] = set()  # with ghosts: the first page of every insert that hung from the root

    def priority(self, node: TreeNode) -> tuple:
        # First seen when the insert makes its leaf (whole, at its own depth); the nodes later split from it keep
        # its clock, and so its answer.
        new_root = self.new_root.get(node.created)
        if new_root is None:
            new_root = node.prefix_len == 0
            if new_root and self.ghosts:
                first = node.key[: len(node.key) // len(node.blocks)].tobytes()  # its first page
                new_root = first not in self.first_pages
                self.first_pages.add(first)
            self.new_root[node.created] = new_root
        if new_root and node.hit_count == 0:
            if math.isinf(self.offset):
                return (0, node.last_access)
            return (1, node.last_access - self.offset)
        return (1, node.last_access)


def reread_distances(paths: list[list[int]]) -> np.ndarray:
    """For every read of a block read before: how many distinct blocks were read since its previous read."""
    total = sum(len(path) for path in paths)
    tree = [0] * (total + 1)  # a Fenwick tree over read positions: 1 where a block's latest read is
    latest: dict[int, int] = {}
    distances = []

    def add(i: int, v: int) -> None:
        i += 1
        while i <= total:
            tree[i] += v
            i += i & -i

    def before(i: int) -> int:  # latest reads at positions < i
        s = 0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    position = 0
    for path in paths:
        for block in reversed(path):  # deepest first
            previous = latest.get(block)
            if previous is not None:
                distances.append(before(position) - before(previous + 1))
                add(previous, -1)
            latest[block] = position
            add(position, 1)
            position += 1
    return np.array(distances)


def trace_shape(path: str) -> str:
    """Re-read distance percentiles and first-block read counts of a hash trace, as text."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    paths = [line["hash_ids"] for line in lines if line["hash_ids"]]
    marks = (10, 25, 50, 75, 90)
    distances = np.percentile(reread_distances(paths), marks)
    readers = collections.Counter(p[0] for p in paths)
    once = sum(1 for n in readers.values() if n == 1)
    return (
        "re-read distances (distinct blocks between two reads), percentiles "
        + ", ".join(f"{m}th {d:,.0f}" for m, d in zip(marks, distances, strict=True))
        + f"\nfirst blocks: {len(readers):,}, read by one request {once:,}, by 2 to {max(readers.values())} "
        + f"requests {len(readers) - once:,}"
    )


def rules(keeps: list[int], offsets: list[float]) -> dict[str, EvictionPolicy]:
    """Fresh policies by column name."""
    out: dict[str, EvictionPolicy] = {f"bip-{k}": BimodalInsertion(k) for k in keeps}
    out.update({f"new-root-{offset:g}": NewRootLater(offset) for offset in offsets})
    out.update({f"new-root-{offset:g}-ghosts": NewRootLater(offset, ghosts=True) for offset in offsets})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="a Mooncake-format hash trace")
    ap.add_argument("--fractions", default="0.02,0.05,0.1,0.2", help="capacities as shares of the unique blocks")
    ap.add_argument("--block-size", type=int, default=512)
    ap.add_argument("--keep", default="2,4,8", help="bip: keep one insert in K, for each K")
    ap.add_argument("--offsets", default="300,1000,inf", help="new-root: how many ticks older, for each")
    args = ap.parse_args()
    fractions = study_fractions(ap, args)
    keeps, offsets = _keeps(ap, args.keep), _offsets(ap, args.offsets)  # before the trace is read
    workload = study_workload(ap, args)  # first: trace_shape reads the lines as they are
    print(trace_shape(args.trace))
    names = list(rules(keeps, offsets))
    print("| capacity | lru | belady | " + " | ".join(names) + " |")
    print("|---:|---:|---:|" + "---:|" * len(names))
    for capacity in capacities_for(workload, fractions):
        lru, belady = (simulate(workload, capacity, name).hit_rate for name in ("lru", "belady"))
        gap = belady - lru
        row = [str(capacity), f"{lru * 100:.2f}%", f"{belady * 100:.2f}%"]
        for policy in rules(keeps, offsets).values():
            rate = simulate(workload, capacity, policy, flat=False).hit_rate
            share = (rate - lru) / gap if gap > 0 else 0.0
            row.append(f"{rate * 100:.2f}% ({share * 100:+.0f}%)")
        print("| " + " | ".join(row) + " |", flush=True)


def _keeps(ap: argparse.ArgumentParser, text: str) -> list[int]:
    """--keep: ints >= 1 (0 was a ZeroDivisionError traceback after the first replays; "x" a ValueError)."""
    try:
        keeps = [int(k) for k in text.split(",")]
    except ValueError:
        keeps = []
    if not keeps or min(keeps) < 1:
        ap.error(f"--keep {text!r}: expected ints >= 1 (keep one insert in K), like 2,4,8")
    return keeps


def _offsets(ap: argparse.ArgumentParser, text: str) -> list[float]:
    """--offsets: ticks >= 0, or inf (NaN made every key NaN, an order of nothing; a negative one ranked new roots
    younger, the opposite of the rule)."""
    try:
        offsets = [float(o) for o in text.split(",")]
    except ValueError:
        offsets = []
    if not offsets or not all(o >= 0 for o in offsets):
        ap.error(f"--offsets {text!r}: expected ticks >= 0 or inf, like 300,1000,inf")
    return offsets


if __name__ == "__main__":
    main()
