"""`queue_timeout` and the requests of one call (a fork's branches, a group's samples, a batch): they wait behind
their own siblings once the first is admitted (max_running smaller than the call), which says nothing of the
engine's load and which no retry could change. The call's queue deadline holds until its first request is admitted,
then is lifted for all of them; a call none of whose requests is admitted in time still times out, holding nothing."""

from __future__ import annotations

import threading
import time

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import QueueTimeoutError
from radixcache.runtime.testing import RandomModel
from tests.runtime.scheduler.conftest import assert_clean, ids

QUEUE_TIMEOUT = 0.05
STEP_S = 0.02  # each pass takes at least this: a branch of 6 tokens runs well past QUEUE_TIMEOUT


def _slow_engine(tiny: RandomModel) -> Engine:
    engine = Engine(tiny, capacity_blocks=64, page_size=8, max_running=1, queue_timeout=QUEUE_TIMEOUT)
    step = engine.runner.step

    def slow(*args, **kwargs):
        time.sleep(STEP_S)
        return step(*args, **kwargs)

    engine.runner.step = slow  # type: ignore[method-assign]
    return engine


def test_a_fork_wider_than_max_running_is_not_timed_out_by_its_own_branches(tiny: RandomModel) -> None:
    engine = _slow_engine(tiny)
    prefix, tails = ids(12, 1), [ids(3, 10 + i) for i in range(3)]
    branches = engine.fork(prefix, continuations=tails, max_new_tokens=6, ignore_eos=True)  # before: QueueTimeoutError
    expected = [engine.generate(prefix + t, 6, ignore_eos=True).token_ids for t in tails]  # each alone, greedy
    assert [b.token_ids for b in branches] == expected
    engine.wait_idle(30)
    assert engine.queue.waiting == 0
    assert_clean(engine)


@pytest.mark.parametrize("call", ["batch", "group"])
def test_a_batch_or_group_wider_than_max_running_is_served_whole(tiny: RandomModel, call: str) -> None:
    engine = _slow_engine(tiny)
    prompts = [ids(10, 20 + i) for i in range(3)]
    if call == "batch":
        results = engine.generate(prompts, 6, ignore_eos=True)
    else:
        results = [h.result(timeout=60) for h in engine.submit_group(prompts, 6, ignore_eos=True)]
    assert [r.token_ids for r in results] == [engine.generate(p, 6, ignore_eos=True).token_ids for p in prompts]
    assert_clean(engine)


def test_a_fork_none_of_whose_branches_is_admitted_in_time_still_times_out(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=8, max_running=1, queue_timeout=QUEUE_TIMEOUT)
    held, release = threading.Event(), threading.Event()
    stall = threading.Thread(target=engine._loop.wait_for, args=(lambda _: held.set() or release.wait(30),))
    stall.start()  # a busy engine: nothing is admitted until the call's deadline has passed
    outcome: list[BaseException | object] = []

    def fork() -> None:
        try:
            outcome.append(engine.fork(ids(12, 2), 3, 4, temperature=1.0, seed=0))
        except BaseException as exc:
            outcome.append(exc)

    try:
        assert held.wait(10)
        caller = threading.Thread(target=fork)
        caller.start()
        deadline = time.monotonic() + 10
        while engine.queue.waiting < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.queue.waiting == 3
        time.sleep(2 * QUEUE_TIMEOUT)  # past the call's deadline before the loop may admit any branch
    finally:
        release.set()
        stall.join()
    caller.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], QueueTimeoutError), outcome
    engine.wait_idle(30)
    assert engine.queue.waiting == 0 and engine.stats.prompt_tokens == 0
    assert_clean(engine)


class _Counted:
    """A request's fields the gate touches, counting the writes of its queue deadline."""

    writes = 0

    def __init__(self) -> None:
        self.t_arrival, self.t_admitted, self.on_dequeue = time.perf_counter(), None, None
        self._deadline: float | None = None

    @property
    def queue_deadline(self) -> float | None:
        return self._deadline

    @queue_deadline.setter
    def queue_deadline(self, value: float | None) -> None:
        _Counted.writes += 1
        self._deadline = value


@pytest.mark.parametrize("queue_timeout", [None, 5.0])
def test_a_calls_deadline_is_lifted_once_not_at_each_admission(queue_timeout: float | None) -> None:
    """Each admission of a call's request lifted the deadline of every request of the call again, n x n writes on the
    loop thread (a generate of 8,000 prompts: 4 s), with no queue_timeout too; it is lifted once."""
    from radixcache.runtime.engine.queue_limit import QueueGate
    from radixcache.runtime.engine.request import dequeued

    gate, call = QueueGate(), [_Counted() for _ in range(200)]
    gate.enter(call, queue_timeout)  # type: ignore[arg-type]
    assert all((r.queue_deadline is None) == (queue_timeout is None) for r in call)
    _Counted.writes = 0
    for r in call:
        r.t_admitted = time.perf_counter()
        dequeued(r)  # type: ignore[arg-type]
    assert all(r.queue_deadline is None for r in call) and gate.waiting == 0
    assert _Counted.writes <= len(call)  # before: 200 x 200
