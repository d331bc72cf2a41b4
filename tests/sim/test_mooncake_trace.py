"""The shared Mooncake trace: the simulator reproduces the infinite-cache figures its README states."""

from __future__ import annotations

import pytest

from radixcache.sim.simulation import infinite_capacity, simulate
from radixcache.trace import read_trace
from radixcache.trace.stats import trace_stats
from radixcache.trace.workload import load_workload

from .conftest import MOONCAKE_TRACE

pytestmark = pytest.mark.skipif(
    not MOONCAKE_TRACE.exists(), reason=f"shared Mooncake trace not found at {MOONCAKE_TRACE} (../shared/traces)"
)


def test_infinite_cache_hits_the_readme_figures() -> None:
    workload = load_workload(str(MOONCAKE_TRACE))
    result = simulate(workload, infinite_capacity(workload))
    assert result.requests == 3993
    assert result.prompt_blocks == 121_877
    assert round(result.hit_rate * 100, 1) == 65.1  # README: 65.1% of tokens
    assert round(result.block_hit_rate * 100, 2) == 63.96  # README: 63.96% of block references
    assert result.evicted_blocks == 0


def test_trace_stats_agree_with_the_simulator_and_the_readme() -> None:
    stats = trace_stats(read_trace(MOONCAKE_TRACE))
    assert (stats.unique_blocks, stats.block_refs) == (43_924, 121_877)
    assert round(stats.block_reuse_rate * 100, 2) == 63.96


def test_belady_bounds_every_policy_at_a_small_capacity() -> None:
    workload = load_workload(str(MOONCAKE_TRACE))
    optimum = simulate(workload, 4000, "belady")
    lru = simulate(workload, 4000, "lru")
    assert lru.hit_blocks < optimum.hit_blocks
    assert optimum.hit_rate < simulate(workload, infinite_capacity(workload)).hit_rate
