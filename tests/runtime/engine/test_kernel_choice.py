"""Whichever kernel the measurement picks, the model computes the same thing: with every product forced onto each path
(runtime.model.linear's PATHS) the logits stay within float32 summation error of a float64 reference, and the
engine's greedy tokens on the tiny model equal those of the fixed rules, for prompts whose prefill chunks and decode
batches cover every row bucket. The Engine's `kernels` option: measured and cached under XDG_CACHE_HOME, "fixed",
and bad values refused by name."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from radixcache.runtime.engine.engine import Engine
from radixcache.runtime.engine.engine_config import EngineConfig
from radixcache.runtime.model import kernel_tune
from radixcache.runtime.model.kernel_plan import BUCKETS, KernelPlan
from radixcache.runtime.model.kernel_tune import apply_plan, model_linears
from radixcache.runtime.model.linear import PATHS, _has_onednn_linear
from radixcache.runtime.model.llama import LlamaModel
from radixcache.runtime.model.reference import reference_logits
from radixcache.runtime.testing import random_weights, tiny_config

RUNNABLE = [p for p in PATHS if p != "onednn" or _has_onednn_linear()]
CONFIG = tiny_config(max_position=1024)
WEIGHTS = random_weights(CONFIG, seed=21)
# float32 against float64 through 2 layers: the paths differ in summation order only (the fixed rules are held to
# the same bound in test_model_vs_reference.py).
TOL = 1e-4
PROMPT_LENGTHS = (3, 9, 20, 70, 300)  # prefill chunks of up to 64 rows (chunk_size) and a 300-row one


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(8)
    return [torch.randint(1, CONFIG.vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


@functools.cache
def _reference(n: int) -> torch.Tensor:
    return reference_logits(CONFIG, WEIGHTS, _prompts()[PROMPT_LENGTHS.index(n)], dtype=torch.float64)


def _force(model: LlamaModel, path: str) -> None:
    """Every product of `model` on `path` at every row count."""
    layers = model_linears(model)
    shapes = {f"{x.weight.shape[0]}x{x.weight.shape[1]}" for x in layers}
    apply_plan(layers, KernelPlan({}, {s: dict.fromkeys(BUCKETS, path) for s in shapes}))


@pytest.mark.parametrize("path", RUNNABLE)
def test_each_path_keeps_the_logits_within_float32_error_of_a_float64_reference(path: str) -> None:
    model = LlamaModel(CONFIG, WEIGHTS)
    _force(model, path)
    for ids in _prompts()[2:]:
        want = _reference(len(ids))
        pool = model.new_pool(64, 16)
        for chunk in (7, 64, 512):  # 7-, 64- and 300-row products
            got = model.prefill(ids, 0, list(range(-(-len(ids) // 16))), pool, chunk_size=chunk, all_logits=True)
            err = (got.double() - want.double()).abs().max().item()
            assert err < TOL, f"{path}, {len(ids)} tokens in chunks of {chunk}: {err:.3g}"


def _greedy(engine: Engine) -> list[tuple[int, ...]]:
    """Greedy tokens of all prompts at once (decode batches of 5 down to 1), then of each alone (batch 1)."""
    together = engine.generate(_prompts(), max_new_tokens=10, temperature=0.0, ignore_eos=True)
    alone = [engine.generate(p, max_new_tokens=6, temperature=0.0, ignore_eos=True) for p in _prompts()[:2]]
    return [r.token_ids for r in (*together, *alone)]


def test_greedy_tokens_are_the_same_whichever_path_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixed = Engine(LlamaModel(CONFIG, WEIGHTS), kernels="fixed", threads=1, capacity_blocks=256)
    with fixed:
        want = _greedy(fixed)
    for path in RUNNABLE:
        model = LlamaModel(CONFIG, WEIGHTS)
        with Engine(model, kernels="fixed", threads=1, capacity_blocks=256) as engine:
            _force(model, path)
            assert _greedy(engine) == want, path
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(kernel_tune, "BUSY_WAITING", float("inf"))
    with Engine(LlamaModel(CONFIG, WEIGHTS), kernels="auto", threads=1, capacity_blocks=256) as tuned:
        assert tuned.kernel_plan.source == "measured"
        assert _greedy(tuned) == want


def test_the_engine_measures_once_then_reads_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(kernel_tune, "BUSY_WAITING", float("inf"))
    monkeypatch.delenv("RADIXCACHE_KERNELS")  # the suite's "fixed": the default is "auto"
    first = Engine(LlamaModel(CONFIG, WEIGHTS), threads=1, capacity_blocks=64)
    second = Engine(LlamaModel(CONFIG, WEIGHTS), threads=1, capacity_blocks=64)
    third = Engine(LlamaModel(CONFIG, WEIGHTS), threads=1, capacity_blocks=64, kernels="retune")
    for engine in (first, second, third):
        engine.close()
    assert [e.kernel_plan.source for e in (first, second, third)] == ["measured", "cache", "measured"]
    assert first.kernel_plan.path == second.kernel_plan.path == third.kernel_plan.path
    assert Path(first.kernel_plan.path).parent == tmp_path / "radixcache" / "kernels"
    assert all(layer.paths is not None for layer in model_linears(second.model))


def test_the_kernels_option_and_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert EngineConfig(kernels="fixed").kernel_mode() == "fixed"
    monkeypatch.setenv("RADIXCACHE_KERNELS", "retune")
    assert EngineConfig().kernel_mode() == "retune" and EngineConfig(kernels="auto").kernel_mode() == "auto"
    monkeypatch.delenv("RADIXCACHE_KERNELS")
    assert EngineConfig().kernel_mode() == "auto"
    with pytest.raises(ValueError, match="kernels must be one of auto, fixed, retune, got 'fast'"):
        EngineConfig(kernels="fast")
    monkeypatch.setenv("RADIXCACHE_KERNELS", "turbo")
    with pytest.raises(ValueError, match="RADIXCACHE_KERNELS must be one of auto, fixed, retune, got 'turbo'"):
        EngineConfig()
    with pytest.raises(TypeError, match="kernel"):
        Engine(LlamaModel(CONFIG, WEIGHTS), kernel="auto")
