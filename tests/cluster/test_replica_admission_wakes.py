"""A replica's stream learns of its request's admission by a hook the engine calls, not by polling: each waiting
stream woke every 20 ms until admitted (a thousand queued requests: 50,000 wake-ups a second). A real replica engine
in-process (tests/cluster/inproc_front.py) whose first forward pass is held: one request admitted and held, a second
queued behind it; no stream wakes without a cause (its admission, tokens or end), and the front door still hears of
the first one's admission before any token."""

from __future__ import annotations

import queue
import threading
import time
import types
from typing import Any

import pytest


def test_a_waiting_stream_wakes_only_for_its_admission_tokens_and_end(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixcache.runtime.cluster import replica as replica_module
    from tests.cluster.inproc_front import inproc_front

    idle: list[int] = []  # wake-ups with nothing to wake for (a poll's timeout)

    class Counting(queue.SimpleQueue):
        def get(self, block: bool = True, timeout: float | None = None) -> Any:
            try:
                return super().get(block, timeout)
            except queue.Empty:
                idle.append(1)
                raise

    monkeypatch.setattr(replica_module, "queue", types.SimpleNamespace(SimpleQueue=Counting, Empty=queue.Empty))
    engine_kwargs = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64", "max_running": 1}
    with inproc_front(monkeypatch, 1, "round_robin", engine_kwargs) as engine:
        replica = engine.replicas[0]
        forward, entered, gate = replica.runner.step, threading.Event(), threading.Event()

        def held(*args: Any) -> Any:  # the first forward pass runs only once the gate opens
            entered.set()
            gate.wait(30)
            return forward(*args)

        monkeypatch.setattr(replica.runner, "step", held)
        try:
            first = engine.submit([5, 6, 7, 8, 9], 3)
            assert entered.wait(30), "the replica never ran its forward pass"
            second = engine.submit([9, 8, 7, 6, 5], 3)  # queued: max_running 1, and the loop is held
            deadline = time.monotonic() + 10
            while engine.queue.waiting != 1 and time.monotonic() < deadline:  # the first's admission crosses threads
                time.sleep(0.01)
            assert engine.queue.waiting == 1 and not first.request.output_ids  # admitted, no token yet
            time.sleep(0.3)  # the second waits: a poll every 20 ms woke its stream some 15 times meanwhile
            gate.set()
            assert len(first.result(30).token_ids) == 3 and len(second.result(30).token_ids) == 3
        finally:
            gate.set()
    assert idle == []
