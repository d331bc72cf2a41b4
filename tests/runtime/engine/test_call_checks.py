"""Every request of a call is checked before any is queued: one bad prompt or option in a batch, group or fork
refuses the whole call, and nothing runs, nothing is cached, nothing is counted."""

from __future__ import annotations

import asyncio

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import RequestTooLargeError
from radixcache.runtime.testing import RandomModel

TOO_LARGE = "a prompt of 100 tokens needs 25 pages of 4 tokens, but the whole KV pool holds 16 pages"


def assert_untouched(engine: Engine) -> None:
    """Nothing of the refused call ran: no request counted, no page cached or held, nothing queued."""
    assert engine.stats.requests == 0
    assert engine.cache.free_blocks == engine.cache.capacity_blocks
    assert engine.queue.waiting == 0
    engine.cache.check_invariants()


def test_a_prompt_past_the_pool_refuses_its_whole_batch_before_any_runs(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=16, page_size=4)  # 64 tokens in all
    batch = [[1] * 10, [2] * 100, [3] * 10]
    with pytest.raises(RequestTooLargeError, match=TOO_LARGE):
        engine.generate(batch, 30)
    assert_untouched(engine)
    with pytest.raises(RequestTooLargeError, match=TOO_LARGE):
        engine.submit(batch, 30)
    with pytest.raises(RequestTooLargeError, match=TOO_LARGE):
        engine.submit_group(batch, 30)
    with pytest.raises(RequestTooLargeError, match=TOO_LARGE):
        engine.fork([1] * 10, continuations=[[5], [2] * 90, [6]], max_new_tokens=30)
    with pytest.raises(RequestTooLargeError, match=TOO_LARGE):
        asyncio.run(engine.agenerate(batch, 30))
    chats = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "a" * 79}]]  # 100 tokens rendered
    with pytest.raises(RequestTooLargeError, match=TOO_LARGE):
        engine.chat(chats, 30)
    assert_untouched(engine)
    assert [len(r.token_ids) for r in engine.generate([[1] * 10, [3] * 10], 5, ignore_eos=True)] == [5, 5]
