"""Cancels from another thread at any moment (waiting, mid-prefill chunk, staged between passes, mid-decode, as it
finishes, twice, through `cancel()` or the future's own `cancel()`), beside requests sharing the victim's prefix in
flight, in pools small enough to preempt: the others produce the tokens they produce alone, a cancelled request
keeps a prefix of its own, and once all are done the cache holds nothing but pins (released at the end)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.scheduler import SchedulerConfig
from radixcache.runtime.testing import RandomModel

from .conftest import assert_clean, ids


@pytest.mark.parametrize("seed", range(8))
def test_cancels_from_another_thread_spare_the_others_and_the_cache(tiny: RandomModel, seed: int) -> None:
    rng = random.Random(seed)
    cfg = SchedulerConfig(
        prefill_chunk=rng.choice([3, 8, 512]),
        max_prefill_tokens=rng.choice([5, 64]),
        mixed_prefill_tokens=3,
        staged_prefill_attention=rng.choice([None, 30]),
        max_running=rng.choice([2, 8]),
    )
    capacity = rng.choice([14, 30, 200])
    engine = Engine(tiny, capacity_blocks=capacity, page_size=4, scheduler_config=cfg)
    alone = Engine(tiny, capacity_blocks=512, page_size=4)
    root = ids(30, seed)
    prompts = [root[: rng.randint(4, 30)] + ids(rng.randint(1, 8), 100 + 10 * seed + i) for i in range(6)]
    if seed % 2:  # one call: the first computes the common prefix, the others wait for its pages
        handles = engine.submit_group(prompts, 20, ignore_eos=True)
    else:
        pin = capacity > 100  # a pin must fit the pinned share
        handles = [
            engine.submit(p, rng.randint(1, 20), ignore_eos=True, pin=pin and i % 3 == 0) for i, p in enumerate(prompts)
        ]
    victims = rng.sample(range(len(prompts)), 2)

    def cancel() -> None:
        for v in victims:
            time.sleep(rng.random() * 0.05)  # any moment: where the victim is then does not matter to the checks
            (handles[v].cancel if rng.random() < 0.5 else handles[v].future.cancel)()
            handles[v].cancel()  # twice: a no-op

    thread = threading.Thread(target=cancel)
    thread.start()
    thread.join(60)
    for i, h in enumerate(handles):
        want = alone.generate(prompts[i], h.request.params.max_new_tokens, ignore_eos=True).token_ids
        if i in victims:
            if not h.future.cancelled():
                got = h.result(30).token_ids
                assert got == want[: len(got)]
        else:
            assert h.result(30).token_ids == want, i
    assert engine.wait_idle(30)
    engine.unpin()
    assert_clean(engine)
    assert engine.cache.locked_blocks == 0
    engine.close()
