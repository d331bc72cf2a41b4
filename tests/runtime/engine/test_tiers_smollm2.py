"""SmolLM2 with a host tier and a disk tier, at pages of 16 tokens (and of 1 in the extended tier): greedy outputs
equal the outputs without any cache while pages are demoted to the host, loaded back, and restored from disk by a
restarted engine."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from radixcache.runtime import Engine

pytestmark = pytest.mark.slow
MAX_NEW = 6
SYSTEM = (
    "You are a careful assistant for a travel company. Answer in one short sentence, name the city you mean, "
    "and never invent prices or dates. "
)
QUESTIONS = [
    "What is the capital of France?",
    "Which river runs through Paris?",
    "What is the capital of Italy?",
    "Which city hosts the Louvre?",
    "What is the capital of Spain?",
    "Name a famous bridge in London.",
]


def _prompts(tokenizer: Any) -> list[list[int]]:
    """Turns that share the system prompt, and later turns that repeat an earlier turn's whole prompt."""
    first = [tokenizer.encode(SYSTEM * 2 + q) for q in QUESTIONS]
    return first + [p + tokenizer.encode(" Please be brief.") for p in first[:3]]


def _staggered(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    handles = []
    for i in range(0, len(prompts), 2):  # waves that arrive while earlier requests prefill or decode
        handles += engine.submit(prompts[i : i + 2], max_new_tokens=MAX_NEW)
        time.sleep(0.05)
    return [h.result(timeout=300).token_ids for h in handles]


# Pages of one token are in the extended tier (tests/conftest.py): test_tiers_engine.py's
# test_tiered_outputs_equal_uncached_outputs_through_demotion_load_and_restart runs them (every write policy) on the
# tiny model, and SmolLM2's pages of 16 here carry its KV through the host and the disk and back. 11.8 s of the last
# full run under load.
@pytest.mark.parametrize("page_size", [pytest.param(1, marks=pytest.mark.extended), 16])
def test_smollm2_outputs_with_tiers_equal_outputs_without_cache(
    smollm2: Any, smollm2_fp32: Any, tmp_path: Path, page_size: int
) -> None:
    # The three engines run the session's float32 model (tests/conftest.py: `Engine(smollm2)` as built, its weights
    # named by the file's digest as `Engine(smollm2, cache_dir=...)` names them): three builds fewer per page size.
    model = {"model": smollm2_fp32, "tokenizer": smollm2.tokenizer}
    prompts = _prompts(smollm2.tokenizer)
    with Engine(**model, enable_cache=False, capacity_blocks=4096 // page_size, page_size=page_size) as plain:
        want = [r.token_ids for r in plain.generate(prompts, max_new_tokens=MAX_NEW)]
    longest = max(len(p) for p in prompts) + MAX_NEW
    small = -(-(longest + 16) // page_size) + 1  # room for one request: the others are demoted (or preempted)
    host = 64 << 20
    tiers = {"page_size": page_size, "cache_dir": tmp_path, "host_kv_memory": host, "load_back": "always"}
    with Engine(**model, capacity_blocks=small, write_policy="write_back", **tiers) as engine:
        assert _staggered(engine, prompts) == want
        assert _staggered(engine, prompts[::-1]) == want[::-1]
        engine.check()
        counters = engine.stats.tiers
        assert counters.host_saved_pages > 0 and counters.host_loaded_pages > 0
    tiers.pop("host_kv_memory")
    with Engine(**model, capacity_blocks=small, **tiers) as restarted:
        assert _staggered(restarted, prompts) == want
        restarted.check()
        counters = restarted.stats.tiers
        assert counters.disk_loaded_pages > 0 and counters.disk_failed_reads == 0
