"""Preemption with the decode mirror (radixcache.runtime.kv.mirror) on gives the tokens and logits of the mirror
off, for plain requests and for sessions in a tiny pool.
"""

from __future__ import annotations

import asyncio
import time

from radixcache.runtime import Engine
from radixcache.runtime.testing import RandomModel, hold_engine_loop
from tests.runtime.engine.mirror_twin import assert_same_results, ids


def test_preemption_gives_the_same_tokens_with_the_mirror_on_and_off(tiny: RandomModel) -> None:
    prompts = [ids(20, 300 + i) for i in range(8)]
    on = Engine(tiny, capacity_blocks=40, page_size=4)  # 8 requests need ~100 pages at their ends
    off = Engine(tiny, capacity_blocks=40, page_size=4, mirror_memory=0)
    assert on.mirror is not None and off.mirror is None
    a = on.generate(prompts, 30, ignore_eos=True, return_logits=True)
    b = off.generate(prompts, 30, ignore_eos=True, return_logits=True)
    assert_same_results(a, b)
    assert on.stats.preemptions > 0 and off.stats.preemptions > 0
    # Each request's context is loaded at least once, at its first decode step (again after each preemption).
    assert on.mirror.positions_loaded >= sum(len(p) - 1 for p in prompts)


def test_sessions_in_a_tiny_pool_with_preemption_match_the_mirror_off(tiny: RandomModel) -> None:
    histories = [ids(24, 100 + i % 3) + ids(5 + i, 1000 + i) for i in range(8)]

    async def run(engine: Engine) -> list:
        release = hold_engine_loop(engine)
        tasks = [engine.agenerate(h, 6 + i % 3, ignore_eos=True, return_logits=True) for i, h in enumerate(histories)]
        futures = [asyncio.ensure_future(t) for t in tasks]
        # agenerate builds its request on a worker thread: all eight are queued before the loop runs, or the tiny
        # pool may never need a preemption (a loaded machine let the first ones finish before the last arrived)
        deadline = time.monotonic() + 30
        while engine.queue.waiting < len(tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        release()
        return list(await asyncio.gather(*futures))

    on = Engine(tiny, capacity_blocks=24, page_size=4, max_prefill_tokens=48)
    off = Engine(tiny, capacity_blocks=24, page_size=4, max_prefill_tokens=48, mirror_memory=0)
    assert_same_results(asyncio.run(run(on)), asyncio.run(run(off)))
    assert on.stats.preemptions > 0
