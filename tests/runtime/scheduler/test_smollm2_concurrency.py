"""SmolLM2 under continuous batching: 16 interleaved chat sessions (greedy, a few tokens each) give the tokens of
the same requests run alone with the cache off, and (in the extended tier) in a pool small enough to evict and
preempt; quant="gguf".
Skipped where the model package is not installed; loaded once for this module."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.model.llama import LlamaModel

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smollm2_concurrency")]
# Under xdist one worker runs this module, so its module-scoped SmolLM2 runs are built once, not once per worker.
TOL = 1e-3  # batched and single decode sum in different orders; the tokens must be identical
SYSTEMS = ["You are a helpful assistant.", "You answer in French.", "You are a pirate.", "Be terse."]


@pytest.fixture(scope="module")
def smol(smollm2_gguf: Any) -> Any:
    return smollm2_gguf  # loaded once per run, with its Q4_1 blocks (tests/conftest.py)


@pytest.fixture(scope="module")
def model(smollm2_gguf_model: Any) -> LlamaModel:
    # quant="gguf": decode batches of up to 8 on the blocks, larger ones on the float32 weights, so a request run
    # alone and the same request among 16 take different products (as float32's batched and single decodes do); the
    # model built once per worker (tests/conftest.py)
    return smollm2_gguf_model


def conv(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEMS[i % 4]}, {"role": "user", "content": f"Name a colour, {i}."}]


def turn2(i: int) -> dict[str, str]:
    return {"role": "user", "content": "Another one?"}


@pytest.fixture(scope="module")
def alone(model: LlamaModel, smol: Any) -> dict:
    engine = Engine(model, tokenizer=smol.tokenizer, capacity_blocks=64, page_size=16, enable_cache=False)
    out = {}
    for i in range(16):
        msgs = conv(i)
        for k in range(2):
            r = engine.chat(msgs, 3, ignore_eos=True, return_logits=True)
            out[i, k] = r
            msgs = [*msgs, {"role": "assistant", "content": r.text}, turn2(i)]
    return out


# The small pool's case is in the extended tier (tests/conftest.py): its scheduling, eviction and preemption are the
# tiny model's (test_concurrency.py: every schedule, test_a_pool_too_small_forces_preemption_and_changes_nothing), and
# on SmolLM2's blocks a prefix computed once and reused gives the tokens of its recompute
# (test_quant_gguf.py::test_the_engine_answers_and_its_cache_changes_nothing). 21.6 s of the last full run under load.
SMALL_POOL = pytest.param(20, "dfs-weight", marks=pytest.mark.extended)


@pytest.mark.parametrize(("blocks", "schedule"), [(128, "lpm"), SMALL_POOL])
def test_sixteen_interleaved_sessions_equal_the_requests_run_alone(
    model: LlamaModel, smol: Any, alone: dict, blocks: int, schedule: str
) -> None:
    engine = Engine(model, tokenizer=smol.tokenizer, capacity_blocks=blocks, page_size=16, schedule=schedule)
    got: dict = {}

    async def session(i: int) -> None:
        msgs = conv(i)
        for k in range(2):
            r = await engine.achat(msgs, 3, ignore_eos=True, return_logits=True)
            got[i, k] = r
            msgs = [*msgs, {"role": "assistant", "content": r.text}, turn2(i)]

    async def main() -> None:
        await asyncio.gather(*(session(i) for i in range(16)))

    asyncio.run(main())
    for key, want in alone.items():
        assert got[key].token_ids == want.token_ids, key
        assert (got[key].logits - want.logits).abs().max().item() < TOL, key
    engine.cache.check_invariants()
    assert engine.cache.locked_blocks == 0 and engine.cache.held_blocks == 0
    s = engine.stats
    assert s.cached_tokens > 0
    if blocks == 20:
        assert s.cache.evicted_blocks > 0, "the small pool evicted"
