"""Fault injection: a fault raised at one stage of one request (validation, admission, commits, pins, decode growth,
sampling, penalties, logprobs, stop strings, detokenizing, event publishing, the host/disk tier copy, result building,
the listener), at a seeded random run of that stage, while eight requests of mixed kinds run (harness.py): only that
request fails, with the injected error; every other output equals a clean run's; the cache's invariants hold and no
block stays locked (once the pin is released). With and without tiers (a host tier and a disk cache directory)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.testing import RandomModel
from tests.runtime.faults.conftest import assert_clean
from tests.runtime.faults.harness import STAGES, Injected, Outcome, draw_fault, fault_engine, run_workload

VARIANTS = ("plain", "tiers")


def _engine(model: RandomModel, variant: str, directory: Path) -> Engine:
    if variant == "plain":
        return fault_engine(model)
    host = 48 * 4 * model.config.kv_bytes_per_token(8)  # 48 pages of 4 float64 tokens
    return fault_engine(model, host_kv_memory=host, cache_dir=directory)


@pytest.fixture(scope="module")
def clean(tiny: RandomModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    runs = {}
    for variant in VARIANTS:
        with _engine(tiny, variant, tmp_path_factory.mktemp("clean")) as engine:
            runs[variant] = run_workload(engine, None)
        assert not runs[variant].errors
        assert len(runs[variant].tokens) == 8
    assert runs["plain"].tokens == runs["tiers"].tokens
    return runs


def _check(engine: Engine, out: Outcome, clean: Outcome, victim: int) -> None:
    assert out.fired
    assert set(out.errors) == {victim}, out.errors
    assert isinstance(out.errors[victim], Injected)
    assert {i: t for i, t in out.tokens.items()} == {i: t for i, t in clean.tokens.items() if i != victim}
    engine.unpin()
    assert_clean(engine)
    assert engine.cache.locked_blocks == 0


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_fault_at_one_stage_fails_only_the_request_that_owns_it(
    tiny: RandomModel, clean: dict[str, Outcome], tmp_path: Path, stage: str, variant: str
) -> None:
    if variant == "plain" and stage == "tier_copy":
        pytest.skip("no tiers")
    fault = draw_fault(stage, clean[variant], random.Random(f"{stage}/{variant}"))
    with _engine(tiny, variant, tmp_path) as engine:
        out = run_workload(engine, fault)
        _check(engine, out, clean[variant], fault.victim)


@pytest.mark.parametrize("seed", range(4))
def test_faults_at_random_stages_and_steps(
    tiny: RandomModel, clean: dict[str, Outcome], tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    variant = VARIANTS[seed % 2]
    stage = rng.choice([s for s in sorted(STAGES) if variant == "tiers" or s != "tier_copy"])
    fault = draw_fault(stage, clean[variant], rng)
    with _engine(tiny, variant, tmp_path) as engine:
        out = run_workload(engine, fault)
        _check(engine, out, clean[variant], fault.victim)
