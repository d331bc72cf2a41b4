"""scripts/study_age_oracle.py: its replay is the simulator's, its oracle uses what it is told, it runs end to end."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from radixcache.sim.simulation import simulate
from radixcache.trace.workload import load_workload
from tests.refusals import assert_refused
from tests.sim.conftest import SCRIPTS, load_script

study = load_script("study_age_oracle")


def write_trace(path: Path, seed: int = 0) -> Path:
    """Documents, each read again every 40 to 60 requests, among one-off requests of another size."""
    rng = random.Random(seed)
    docs = [list(range(1000 * d, 1000 * d + 6)) for d in range(12)]
    due = {d: rng.randrange(60) for d in range(len(docs))}
    fresh = iter(range(10**6, 10**7))
    with path.open("w") as out:
        for t in range(500):
            ready = [d for d, when in due.items() if when <= t]
            if ready and rng.random() < 0.6:
                d = ready[0]
                due[d] = t + rng.randrange(40, 60)
                ids = [*docs[d], next(fresh)]
            else:
                ids = [next(fresh) for _ in range(rng.choice([2, 3]))]
            line = {"timestamp": t, "input_length": 16 * len(ids), "output_length": 8, "hash_ids": ids}
            out.write(json.dumps(line) + "\n")
    return path


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_trace(tmp_path_factory.mktemp("age") / "docs.jsonl")


@pytest.mark.parametrize("capacity", [6, 15, 40, 90])
def test_lru_belady_and_lru_dead_are_the_simulators(trace_file: Path, capacity: int) -> None:
    workload = load_workload(trace_file, block_size=16)
    trace = study.TraceArrays(workload)
    for ranker, policy in ((None, "lru"), (study.belady, "belady"), (study.lru_dead, "lru-dead")):
        ours = study.replay(trace, capacity, ranker)[0]
        assert ours == pytest.approx(simulate(workload, capacity, policy).hit_rate, abs=1e-12), policy


def test_the_in_sample_oracle_uses_when_documents_return(trace_file: Path) -> None:
    trace = study.TraceArrays(load_workload(trace_file, block_size=16))
    model = study.SurvivalModel(trace, study.FEATURES, trace.n, min_events=5)
    lru = study.replay(trace, 40)[0]
    oracle = study.replay(trace, 40, study.age_ranker(model, trace, 60, "p"))[0]
    belady = study.replay(trace, 40, study.belady)[0]
    assert lru < oracle <= belady  # one-offs are never read again: the oracle evicts them first


def test_the_online_ranker_is_lru_until_its_first_refit_and_sees_only_the_past(trace_file: Path) -> None:
    trace = study.TraceArrays(load_workload(trace_file, block_size=16))
    never = study.online_ranker(trace, study.FEATURES, 5, 0.0, trace.n + 1, 60, "p")
    assert study.replay(trace, 40, never)[0] == study.replay(trace, 40)[0]

    fitted: list[int] = []
    original = study.SurvivalModel

    class Recording(original):  # type: ignore[misc, valid-type]
        def __init__(self, trace: object, features: tuple[str, ...], cut: int, min_events: int = 30) -> None:
            fitted.append(cut)
            super().__init__(trace, features, cut, min_events)

    study.SurvivalModel = Recording
    try:
        study.replay(trace, 40, study.online_ranker(trace, study.FEATURES, 5, 0.0, 100, 60, "p"))
    finally:
        study.SurvivalModel = original
    assert fitted and fitted == sorted(fitted) and fitted[0] >= 100  # in order, none before request 100
    assert len({cut // 100 for cut in fitted}) == len(fitted)  # at most once per span of 100 requests


def test_survival_is_fitted_only_on_reads_before_the_cut(trace_file: Path) -> None:
    trace = study.TraceArrays(load_workload(trace_file, block_size=16))
    whole = study.SurvivalModel(trace, study.FEATURES, trace.n)
    early = study.SurvivalModel(trace, study.FEATURES, 100)
    for (_, survivors_whole, _, _), (_, survivors_early, _, _) in zip(whole.levels, early.levels, strict=True):
        # every read before the cut, once; a read in the request just before it says nothing (interval > 0)
        assert survivors_early[:, 0].sum() == (trace.req < 99).sum()
        assert survivors_whole[:, 0].sum() == (trace.req < trace.n - 1).sum()


def test_the_study_prints_a_row_per_capacity(trace_file: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "study_age_oracle.py"),
            str(trace_file),
            "--block-size",
            "16",
            "--fractions",
            "0.1,0.3",
            "--scores",
            "p:50",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 2
    assert all(f"p H=50 {fit}" in out for fit in ("in-sample", "first-half", "online"))
    assert "by quarter" in out


def test_an_unknown_feature_is_refused(trace_file: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "study_age_oracle.py"), str(trace_file), "--features", "size,colour"],
        capture_output=True,
        text=True,
    )
    assert_refused(result, "unknown feature 'colour'")
    assert "unknown feature 'colour'" in result.stderr
