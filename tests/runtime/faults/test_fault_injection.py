"""Fault injection: a fault raised at one stage of one request (validation, admission, commits, pins, decode growth,
sampling, penalties, logprobs, stop strings, detokenizing, event publishing, the host/disk tier copy, result building,
the listener, the forward pass), at a seeded random run of that stage, while eight requests of mixed kinds run
(harness.py): only that request fails, with the injected error; every other output equals a clean run's; the cache's
invariants hold and no block stays locked (once the pin is released). Without tiers, with a host tier and a disk
cache directory, and restarted on a directory a clean run filled (disk reads). A fault in the tier's own copy or
read (host_copy, disk_read) is contained by the tier: its owner may then finish, with the clean output."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.testing import RandomModel
from tests.runtime.faults.conftest import assert_clean
from tests.runtime.faults.harness import (
    CONTAINED,
    STAGES,
    Fault,
    Injected,
    Outcome,
    draw_fault,
    fault_engine,
    run_workload,
)

VARIANTS = ("plain", "tiers", "restart")
TIER_STAGES = {"tier_copy", "host_copy", "disk_read"}
RESTART_STAGES = ("admission", "disk_read", "commit", "event_publish", "host_copy", "result", "forward")


def _engine(model: RandomModel, variant: str, directory: Path) -> Engine:
    """plain: no tiers. tiers: a host tier and a disk cache directory. restart: the same, started on a directory that
    a clean run of the workload filled (its prompts' pages are read back from disk)."""
    if variant == "plain":
        return fault_engine(model)
    host = 48 * 4 * model.config.kv_bytes_per_token(8)  # 48 pages of 4 float64 tokens
    if variant == "restart":
        with fault_engine(model, host_kv_memory=host, cache_dir=directory) as warm:
            run_workload(warm, None)
            assert warm.flush(30)
    return fault_engine(model, host_kv_memory=host, cache_dir=directory)


@pytest.fixture(scope="module")
def clean(tiny: RandomModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    runs = {}
    for variant in VARIANTS:
        with _engine(tiny, variant, tmp_path_factory.mktemp("clean")) as engine:
            runs[variant] = run_workload(engine, None)
        assert not runs[variant].errors
        assert len(runs[variant].tokens) == 8
        assert runs[variant].tokens == runs["plain"].tokens
    assert sum(n for (stage, _), n in runs["restart"].counts.items() if stage == "disk_read") > 0
    return runs


def _check(engine: Engine, out: Outcome, clean: Outcome, fault: Fault) -> None:
    assert out.fired
    if fault.stage in CONTAINED:  # the tier contains it: its owner may finish, with the clean output
        assert set(out.errors) <= {fault.victim}, out.errors
    else:
        assert set(out.errors) == {fault.victim}, out.errors
    assert all(isinstance(e, Injected) for e in out.errors.values()), out.errors
    assert out.tokens == {i: t for i, t in clean.tokens.items() if i not in out.errors}
    engine.unpin()
    assert_clean(engine)
    assert engine.cache.locked_blocks == 0


def _cases() -> list[tuple[str, str]]:
    cases = [(stage, "plain") for stage in sorted(STAGES) if stage not in TIER_STAGES]
    cases += [(stage, "tiers") for stage in sorted(STAGES) if stage != "disk_read"]
    return cases + [(stage, "restart") for stage in RESTART_STAGES]


@pytest.mark.parametrize(("stage", "variant"), _cases())
def test_a_fault_at_one_stage_fails_only_the_request_that_owns_it(
    tiny: RandomModel, clean: dict[str, Outcome], tmp_path: Path, stage: str, variant: str
) -> None:
    fault = draw_fault(stage, clean[variant], random.Random(f"{stage}/{variant}"))
    with _engine(tiny, variant, tmp_path) as engine:
        out = run_workload(engine, fault)
        _check(engine, out, clean[variant], fault)


@pytest.mark.parametrize("seed", range(6))
def test_faults_at_random_stages_and_steps(
    tiny: RandomModel, clean: dict[str, Outcome], tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    stage, variant = rng.choice(_cases())
    fault = draw_fault(stage, clean[variant], rng)
    with _engine(tiny, variant, tmp_path) as engine:
        out = run_workload(engine, fault)
        _check(engine, out, clean[variant], fault)
