"""A front door handle's future behaves as an Engine handle's. A caller that cancels it (an asyncio task awaiting
`asyncio.wrap_future(handle.future)`, cancelled, or timed out by `asyncio.wait_for`) cancels its request on the
replica, as an Engine's handle aborts its request: the replica ran it to its length for nobody, its load counted at
the front door meanwhile. A done-callback that raises, SystemExit included, is logged and the later ones still run.
A real replica engine, in-process (tests/cluster/inproc_ray.py), its loop held where the request must not finish
before the cancel."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from radixcache.runtime.testing import hold_engine_loop
from tests.cluster.inproc_front import inproc_front

ENGINE = {"capacity_blocks": 64, "page_size": 4, "dtype": "float64"}
MAX_NEW = 200


async def _wait_for_then_time_out(front: Any) -> Any:
    handle = front.submit([5, 6, 7, 8, 9], MAX_NEW, ignore_eos=True)
    with pytest.raises(asyncio.TimeoutError):  # wait_for cancels the wrapped future as it times out
        await asyncio.wait_for(asyncio.wrap_future(handle.future), 0.3)
    return handle


def test_cancelling_the_future_of_a_handle_cancels_its_request_on_the_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    with inproc_front(monkeypatch, 1, "cache_aware", ENGINE) as front:
        replica = front.replicas[0]
        release = hold_engine_loop(replica)  # nothing is generated until the cancel has been sent
        try:
            handle = asyncio.run(_wait_for_then_time_out(front))
            assert handle.future.cancelled()
        finally:
            release()
        assert front.wait_idle(60)
        stats = replica.stats
        assert stats.generated_tokens < MAX_NEW, "the request ran to its length on the replica for nobody"
        assert stats.running == stats.waiting == 0 and front.cluster.loads.in_flight() == 0
        again = front.generate([5, 6, 7, 8, 9], 3, ignore_eos=True)  # a request not cancelled runs to its length
        assert again.finish_reason == "length" and len(again.token_ids) == 3


def test_a_done_callback_that_raises_leaves_the_later_ones_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the handle's plain Future let a callback's SystemExit (an agent's hook calling sys.exit()) out of
    its completion in the request's thread, and the callbacks after it never ran: an asyncio waiter waited for ever.
    An Engine handle's future (GuardedFuture) logs it and runs the rest."""
    with inproc_front(monkeypatch, 1, "cache_aware", ENGINE) as front:
        handle = front.submit([5, 6, 7], 3, ignore_eos=True)
        later = threading.Event()

        def hook(_future: Any) -> None:
            raise SystemExit("an agent's last-step hook")

        handle.future.add_done_callback(hook)
        handle.future.add_done_callback(lambda _f: later.set())
        assert later.wait(60), "the callback after the one that raised never ran"
        assert handle.result(10).finish_reason == "length"
