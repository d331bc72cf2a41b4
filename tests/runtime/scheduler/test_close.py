"""Engine.close() and `with Engine(...) as engine:`: requests in flight are cancelled with what they generated, the
loop thread exits, the cache stays consistent, and a closed engine refuses new requests."""

from __future__ import annotations

import threading

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import EngineClosedError
from radixcache.runtime.testing import RandomModel

from .conftest import assert_clean, ids


def test_close_cancels_what_is_in_flight_and_refuses_new_requests(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    started = threading.Event()
    long = engine.submit(ids(10, 1), 400, ignore_eos=True)
    long.request.listener = lambda r: started.set()
    queued = engine.submit(ids(10, 2), 400, ignore_eos=True)
    assert started.wait(30)
    assert engine.close(30)
    first, second = long.result(30), queued.result(30)
    assert first.finish_reason == second.finish_reason == "cancelled"
    assert 0 < len(first.token_ids) < 400
    assert engine._loop.idle()
    assert_clean(engine)
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate(ids(5, 3), 2)
    with pytest.raises(RuntimeError, match="closed"):
        engine.fork(ids(5, 3), 2, max_new_tokens=2)
    assert engine.close(1), "closing twice is harmless"


def test_an_engine_is_a_context_manager(tiny: RandomModel) -> None:
    with Engine(tiny, capacity_blocks=64, page_size=4) as engine:
        r = engine.generate(ids(12, 4), 3, ignore_eos=True)
        assert len(r.token_ids) == 3
    assert engine._loop.idle()
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit(ids(5, 5), 2)
    assert_clean(engine)


def test_a_request_still_being_built_when_close_returns_is_refused(tiny: RandomModel) -> None:
    """close() returned, so nothing may run afterwards: a caller past the closed check, still building its request
    (a grammar compiling, a long prompt encoding), gets EngineClosedError and leaves the queue count at 0."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4, max_queue=4)
    build, building, go = engine._builder.build, threading.Event(), threading.Event()

    def slow_build(prompt: object, options: object, *rest: object) -> object:
        building.set()
        assert go.wait(30)
        return build(prompt, options, *rest)  # type: ignore[arg-type]

    engine._builder.build = slow_build  # type: ignore[method-assign]
    outcome: list[object] = []
    caller = threading.Thread(target=lambda: outcome.append(_call(engine)))
    caller.start()
    assert building.wait(30)
    assert engine.close(30)
    go.set()
    caller.join(30)
    assert isinstance(outcome[0], EngineClosedError), outcome
    assert engine.queue.waiting == 0
    assert engine._loop.idle()
    assert_clean(engine)


def _call(engine: Engine) -> object:
    try:
        return engine.generate(ids(10, 1), 20, ignore_eos=True)
    except Exception as exc:
        return exc
