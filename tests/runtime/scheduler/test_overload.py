"""Overload: the admission queue's bound (QueueFullError at once, all or none), the queue timeout
(QueueTimeoutError, holding nothing), and a request that outgrows the pool after a preemption. Requests arrive while
others prefill or decode, not only before the first step."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import (
    EngineOverloadedError,
    QueueFullError,
    QueueTimeoutError,
    RequestTooLargeError,
)
from radixcache.runtime.engine.queue_limit import QueueGate
from radixcache.runtime.kv.state import Status
from radixcache.runtime.testing import RandomModel

from .conftest import assert_clean, ids


def wait_until(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_past_max_queue_a_submission_is_refused_at_once_and_nothing_is_queued(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=8, max_queue=2, max_running=1)
    holder = engine.submit(ids(20, 1), 400, ignore_eos=True)  # admitted, then decodes for hundreds of steps
    wait_until(lambda: engine.queue.waiting == 0)
    queued = engine.submit(ids(20, 2), 3, ignore_eos=True)  # arrives while the holder decodes: waits (1 of 2)
    with pytest.raises(QueueFullError, match="limit is 2") as refused:
        engine.submit([ids(20, 3), ids(20, 4)], 3)  # 1 + 2 > 2: neither is queued
    assert refused.value.retry_after >= 1
    assert engine.queue.waiting == 1
    also = engine.submit(ids(20, 5), 3, ignore_eos=True)  # 1 + 1 fits
    with pytest.raises(QueueFullError):
        engine.submit(ids(20, 6), 3)
    holder.cancel()
    assert holder.result(timeout=30).finish_reason == "cancelled"
    assert [len(h.result(timeout=30).token_ids) for h in (queued, also)] == [3, 3]
    engine.wait_idle(30)
    assert engine.queue.waiting == 0
    assert_clean(engine)


def test_max_queue_zero_refuses_everything_and_the_count_survives_every_exit(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=4, page_size=8, max_queue=3)
    with pytest.raises(RequestTooLargeError, match="whole KV pool"):  # refused by the scheduler: leaves the queue too
        engine.generate(ids(100, 1), 2)
    cancelled = engine.submit(ids(20, 2), 300, ignore_eos=True)
    cancelled.cancel()
    cancelled.result(timeout=30)
    engine.generate(ids(10, 3), 2)
    engine.wait_idle(30)
    assert engine.queue.waiting == 0
    assert_clean(engine)
    closed = Engine(tiny, capacity_blocks=4, page_size=8, max_queue=0)
    with pytest.raises(QueueFullError):
        closed.generate(ids(10, 3), 2)
    assert closed.queue.waiting == 0 and closed.stats.requests == 0


def test_a_request_not_admitted_within_queue_timeout_fails_holding_nothing(tiny: RandomModel) -> None:
    # Not timed: on a loaded machine the loop thread can start later than a 0.02 s deadline (the holder timed out
    # too), and the holder's 400 tokens can all come before this thread runs again. The holder is queued without a
    # bound; only `late`, which cannot be admitted while the holder runs (max_running=1), gets 0.02 s.
    engine = Engine(tiny, capacity_blocks=64, page_size=8, max_running=1)
    holder = engine.submit(ids(20, 1), 400, ignore_eos=True)
    engine.queue_timeout = 0.02
    late = engine.submit(ids(20, 2), 400, ignore_eos=True)
    with pytest.raises(QueueTimeoutError, match="without being admitted") as dropped:
        late.result(timeout=30)
    assert isinstance(dropped.value, EngineOverloadedError)
    held = holder.result(timeout=60)
    assert held.finish_reason == "length" and len(held.token_ids) == 400, "the timeout is about the queue only"
    engine.wait_idle(30)
    assert engine.queue.waiting == 0
    assert engine.stats.prompt_tokens == 20, "the dropped request was never admitted"
    assert_clean(engine)


def test_queue_timeout_spares_a_request_once_admitted_and_one_preempted_later(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=7, page_size=8, queue_timeout=0.001)
    reqs = [engine._request(ids(12, 10 + i), 30, ignore_eos=True) for i in range(3)]
    for r in reqs:
        r.queue_deadline = time.perf_counter() + 60  # scheduler-level: admitted long before
        engine.scheduler.add(r)
    with torch.inference_mode():
        while engine.scheduler.has_work():
            engine.scheduler.step()
            for r in reqs:  # once admitted, the queue deadline no longer applies, even when it has passed
                if r.t_admitted is not None:
                    r.queue_deadline = 0.0
    assert engine.scheduler.preemptions > 0, "the pool is too small for three: someone was preempted"
    assert all(r.error is None and len(r.output_ids) == 30 for r in reqs)
    assert_clean(engine)


def test_a_preempted_request_that_alone_outgrows_the_pool_keeps_its_tokens(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=6, page_size=8)
    small = engine._request(ids(5, 20), 10, ignore_eos=True, priority=1)  # its 2nd page preempts big
    big = engine._request(ids(30, 21), 100, ignore_eos=True)
    for r in (big, small):
        engine.scheduler.add(r)
    with torch.inference_mode():
        while engine.scheduler.has_work():
            engine.scheduler.step()
    assert small.finish_reason == "length" and len(small.output_ids) == 10
    assert big.error is None and big.finish_reason == "length" and big.kv.preemptions >= 1
    assert len(big.output_ids) == 6 * 8 - 30 + 1
    assert_clean(engine)


@pytest.mark.parametrize(("limit", "waits"), [(0, "0 requests wait"), (1, "1 request waits"), (2, "2 requests wait")])
def test_the_queue_full_message_agrees_with_the_number_waiting(limit: int, waits: str) -> None:
    """max_queue=1 said "1 requests wait for admission"."""
    gate = QueueGate(limit)
    gate.enter([SimpleNamespace() for _ in range(limit)])  # type: ignore[misc]
    with pytest.raises(QueueFullError, match=f"queue is full \\({waits} for admission, the limit is {limit}\\)"):
        gate.enter([SimpleNamespace()])  # type: ignore[list-item]
    assert gate.waiting == limit


def test_a_call_of_more_requests_than_max_queue_is_a_value_error_not_a_full_queue(tiny: RandomModel) -> None:
    """A fork of 3 (or a group or batch of 3) against max_queue=2 was a QueueFullError ("the engine's queue is full
    (0 requests wait...); try again later", a server's 429) on an idle engine: no retry could ever let it in."""
    engine = Engine(tiny, capacity_blocks=64, page_size=8, max_queue=2)
    calls = {
        "fork": lambda: engine.fork(ids(10, 1), 3, 2),
        "submit_group": lambda: engine.submit_group([ids(10, 1)] * 3, 2),
        "generate": lambda: engine.generate([ids(10, 1), ids(10, 2), ids(10, 3)], 2),
    }
    for call in calls.values():
        with pytest.raises(ValueError, match=r"3 requests in one call .* max_queue is 2"):
            call()
        assert engine.queue.waiting == 0
    assert [len(r.token_ids) for r in engine.fork(ids(10, 1), 2, 2, ignore_eos=True)] == [2, 2], "2 fit"
    engine.wait_idle(30)
    assert engine.stats.requests == 2 and engine.queue.waiting == 0
    assert_clean(engine)


def test_a_preempted_request_ended_from_the_queue_by_pins_is_finished_not_left_waiting(tiny: RandomModel) -> None:
    """A preempted request that no longer fits beside pinned pages, with nothing running, ends with "length" and its
    tokens from the waiting queue; its KV state stayed WAITING there, where every other way out is FINISHED or
    ABORTED (it holds nothing: FINISHED now)."""
    engine = Engine(tiny, capacity_blocks=8, page_size=8)
    big = engine._request(ids(30, 21), 100, ignore_eos=True)
    engine.scheduler.add(big)
    small = pinned = None
    with torch.inference_mode():
        while engine.scheduler.has_work():
            engine.scheduler.step()
            if small is None and len(big.output_ids) == 16:  # big 6 of 8 pages; small's 2nd preempts big at 7
                small = engine._request(ids(5, 20), 20, ignore_eos=True, priority=1)
                engine.scheduler.add(small)
            if pinned is None and big.kv.preemptions and big in engine.scheduler.waiting:
                # 2 pinned pages (the pinned share) leave 6 for the 7 big's 50 tokens resume into once small is done
                pinned = engine._request(ids(16, 22), 1, ignore_eos=True, priority=2, pin=True)
                engine.scheduler.add(pinned)
    assert small is not None and small.error is None and len(small.output_ids) == 20
    assert pinned is not None and pinned.error is None and pinned.pinned_tokens > 0
    assert big.error is None and big.finish_reason == "length" and len(big.output_ids) == 20
    assert big.kv.status is Status.FINISHED and not big.kv.block_table
    engine.unpin()
    assert_clean(engine)
