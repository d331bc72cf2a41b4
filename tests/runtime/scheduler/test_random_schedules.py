"""Random workloads driven step by step: prompts sharing prefixes, namespaces, priorities, cancels at random
moments, tiny pools that force eviction and preemption. After every step the cache's invariants hold and the
block counts add up; at the end nothing is held, and every request that completed produced the tokens it
produces alone."""

from __future__ import annotations

import random

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.engine.scheduler import SCHEDULES, SchedulerConfig
from radixcache.runtime.kv.state import Status
from radixcache.runtime.testing import RandomModel

from .conftest import assert_clean, ids


@pytest.mark.parametrize("seed", range(10))
def test_random_workload_keeps_invariants_and_outputs(tiny: RandomModel, seed: int) -> None:
    rng = random.Random(seed)
    page = rng.choice([1, 4, 8])
    capacity = rng.randint(56, 90) // page + 1
    schedule = SCHEDULES[seed % 3]
    cfg = SchedulerConfig(
        schedule=schedule, max_prefill_tokens=rng.choice([7, 32, 200]), max_running=rng.choice([3, 16])
    )
    engine = Engine(tiny, capacity_blocks=capacity, page_size=page, scheduler_config=cfg)
    alone = Engine(tiny, capacity_blocks=512, page_size=page)
    roots = [ids(rng.randint(5, 40), 1000 * seed + i) for i in range(3)]
    reqs = []
    with torch.inference_mode():
        for step in range(600):
            if len(reqs) < 14 and rng.random() < 0.3:
                prompt = rng.choice(roots)[: rng.randint(1, 40)] + ids(rng.randint(1, 12), 7 * step + seed)
                req = engine._request(
                    prompt,
                    rng.randint(1, 30),
                    ignore_eos=True,
                    namespace=rng.choice([None, None, "b"]),
                    priority=rng.choice([0, 0, 1]),
                )
                engine.scheduler.add(req)
                reqs.append(req)
            if reqs and rng.random() < 0.05:
                engine.scheduler.abort(rng.choice(reqs))
            if engine.scheduler.has_work():
                engine.scheduler.step()
            engine.scheduler.drain()
            c = engine.cache
            c.check_invariants()
            held = sum(len(r.kv.held_blocks) for r in engine.scheduler.running)
            assert c.held_blocks == held, "every held block belongs to a running request"
            for r in engine.scheduler.waiting:
                assert r.kv.status is Status.WAITING and not r.kv.block_table and r.kv.match_node is None
            if step > 400 and not engine.scheduler.has_work():
                break
    assert_clean(engine)
    done = [r for r in reqs if r.kv.status is Status.FINISHED]
    assert done, "some requests completed"
    for r in done:
        want = alone.generate(r.prompt_ids, r.params.max_new_tokens, ignore_eos=True)
        if len(r.output_ids) < len(want.token_ids):  # it outgrew the whole pool alone: "length", with what it made
            assert r.finish_reason == "length" and r.num_tokens - 1 >= capacity * page
        assert tuple(r.output_ids) == want.token_ids[: len(r.output_ids)]
    for r in reqs:
        assert r.kv.status in (Status.FINISHED, Status.ABORTED)
