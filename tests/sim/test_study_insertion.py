"""scripts/study_insertion.py: each rule with its neutral setting is LRU, and the study prints a row per capacity."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import subprocess
import sys
from pathlib import Path

from radixcache import RadixCache
from radixcache.sim.simulation import simulate
from radixcache.trace.workload import load_workload
from tests.sim.conftest import SCRIPTS, load_script

SCRIPT = SCRIPTS / "study_insertion.py"


def write_trace(path: Path, seed: int = 0) -> Path:
    """Documents reread a few times among one-off requests, some of them follow-ups that extend a document."""
    rng = random.Random(seed)
    docs = [list(range(1000 * d, 1000 * d + 6)) for d in range(30)]
    fresh = iter(range(10**6, 10**7))
    with path.open("w") as out:
        for t in range(400):
            ids = [*rng.choice(docs), next(fresh)] if rng.random() < 0.5 else [next(fresh) for _ in range(6)]
            out.write(json.dumps({"timestamp": t, "input_length": 16 * len(ids), "output_length": 8, "hash_ids": ids}))
            out.write("\n")
    return path


def figures(result: object) -> dict:
    """Every field of a SimResult but its time and its policy's name."""
    return {k: v for k, v in dataclasses.asdict(result).items() if k not in ("seconds", "policy")}  # type: ignore[call-overload]


def test_keeping_every_insert_and_no_offset_are_lru(tmp_path: Path) -> None:
    study = load_script("study_insertion")
    workload = load_workload(write_trace(tmp_path / "m.jsonl"), block_size=16)
    for capacity in (20, 60, 150):
        lru = figures(simulate(workload, capacity, "lru", flat=False))
        for neutral in (study.BimodalInsertion(1), study.NewRootLater(0.0), study.NewRootLater(0.0, ghosts=True)):
            assert figures(simulate(workload, capacity, neutral, flat=False)) == lru, (capacity, neutral.name)


def test_the_study_prints_a_row_per_capacity_within_the_bounds(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "m.jsonl")
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(path), "--block-size", "16", "--fractions", "0.05,0.1", "--keep", "2"],
        capture_output=True,
        text=True,
        check=True,
    )
    header = next(line for line in run.stdout.splitlines() if line.startswith("| capacity"))
    columns = [c.strip() for c in header.strip("|").split("|")][3:]
    offsets = ["300", "1000", "inf"]
    assert columns == ["bip-2", *(f"new-root-{o}" for o in offsets), *(f"new-root-{o}-ghosts" for o in offsets)]
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        rates = [float(c.split("%")[0]) for c in cells[1:]]
        belady = rates[1]
        assert all(0 <= rate <= belady + 1e-9 for rate in rates)  # nothing beats the resident bound


def test_reread_distances_count_the_distinct_blocks_read_in_between() -> None:
    study = load_script("study_insertion")
    rng = random.Random(1)
    paths = [[rng.randrange(12) for _ in range(rng.randint(1, 5))] for _ in range(60)]
    reads = [block for path in paths for block in reversed(path)]  # the order the study reads them
    naive = []
    for i, block in enumerate(reads):
        if block in reads[:i]:
            previous = max(j for j in range(i) if reads[j] == block)
            naive.append(len(set(reads[previous + 1 : i])))
    assert study.reread_distances(paths).tolist() == naive


def test_with_ghosts_a_returning_root_outlives_a_newer_fresh_one() -> None:
    """A was evicted and comes back: with ghosts it is no longer a new root, so the newer one-off E goes first."""
    study = load_script("study_insertion")

    def final_tree(policy: object) -> list[list[int]]:
        cache = RadixCache(4, page_size=1, policy=policy)  # two leaves of two pages
        for tokens in ([1, 2], [3, 4], [5, 6], [1, 2], [7, 8], [9, 10]):  # A, B, C, A again, E, F
            cache.insert(tokens, cache.allocate(2))
        return [[t, t + 1] for t in (1, 3, 5, 7, 9) if cache.peek([t, t + 1]).length == 2]

    assert final_tree(study.NewRootLater(math.inf)) == [[7, 8], [9, 10]]  # LRU order: A, the oldest, went
    assert final_tree(study.NewRootLater(math.inf, ghosts=True)) == [[1, 2], [9, 10]]


def test_a_keep_or_offset_that_is_no_setting_is_refused_before_the_trace_is_read(tmp_path: Path) -> None:
    """Regression: --keep 0 was a ZeroDivisionError traceback after the LRU and Belady replays of the first capacity,
    --keep x a ValueError traceback, --offsets nan keyed every never-hit root leaf NaN (an order of nothing) and a
    negative offset ranked them younger, the opposite of the rule, both printed as results."""
    missing = tmp_path / "missing.jsonl"  # refused before the trace is read: no word about the file
    for flag, value in (("--keep", "0"), ("--keep", "x"), ("--offsets", "nan"), ("--offsets", "-5"), ("--offsets", "")):
        run = subprocess.run([sys.executable, str(SCRIPT), str(missing), flag, value], capture_output=True, text=True)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert f"{flag} {value!r}: expected" in run.stderr
