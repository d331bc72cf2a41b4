"""A group's samples behind replicas under a queue timeout (real tiny replica engines, in-process; no Ray): they
share one admission deadline, lifted for all once the first is admitted, as one Engine's group (QueueGate.enter):
before, each sample had its own deadline, at the front door and on its replica, so with max_running 1 the samples
after the first timed out behind their own siblings (a 503 no retry would help)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from radixcache.runtime.engine.errors import QueueTimeoutError
from tests.cluster.inproc_front import inproc_front

STEP_S = 0.05  # each forward pass takes at least this: a sample of 12 tokens runs past the 0.5 s queue timeout
KWARGS = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64", "queue_timeout": 0.5, "max_running": 1}


def _slowed(monkeypatch: pytest.MonkeyPatch, replica: Any) -> None:
    step = replica.runner.step

    def slow(*args: Any) -> Any:
        time.sleep(STEP_S)
        return step(*args)

    monkeypatch.setattr(replica.runner, "step", slow)


def test_the_samples_of_one_call_wait_behind_each_other_past_the_queue_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with inproc_front(monkeypatch, 1, "round_robin", KWARGS) as engine:
        _slowed(monkeypatch, engine.replicas[0])
        handles = engine.submit_group([[5, 6, 7, 8, 9]] * 3, 12, ignore_eos=True, temperature=1.0, seed=3)
        results = [h.result(60) for h in handles]
        assert [len(r.token_ids) for r in results] == [12, 12, 12]
        assert max(r.queue_s for r in results) > KWARGS["queue_timeout"]  # one did wait past it, behind the others
        assert engine.replicas[0].check()["locked_blocks"] == 0


def test_a_call_none_of_whose_samples_is_admitted_still_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared deadline is lifted only by an admission: behind another caller's long request, every sample of
    the call fails with QueueTimeoutError (HTTP 503), and the replica runs none of them."""
    with inproc_front(monkeypatch, 1, "round_robin", KWARGS) as engine:
        _slowed(monkeypatch, engine.replicas[0])
        busy = engine.submit([1, 2, 3], 40, ignore_eos=True)  # 2 s at least: holds the one running slot
        while not busy.request.output_ids:
            time.sleep(0.01)
        handles = engine.submit_group([[5, 6, 7, 8, 9]] * 2, 4, ignore_eos=True)
        for h in handles:
            with pytest.raises(QueueTimeoutError):
                h.result(60)
        assert len(busy.result(60).token_ids) == 40
        assert engine.wait_idle(30) and engine.replicas[0].wait_idle(30)
        assert engine.replicas[0].stats.prompt_tokens == 3  # only the busy one's: the samples never ran
