"""The engine loop under faults: a future cancelled between the loop's check and its set cannot kill the thread, a
cancelled future aborts its request, a loop thread that dies anyway makes every later call raise EngineDeadError,
and the scheduler's error paths (step() raising outside the runner, admit raising, a listener raising, a prompt that
does not fit beside pinned blocks) fail only what they must, leaving the cache clean."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import CancelledError, Future
from typing import Any

import pytest

from radixcache import CacheFullError
from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import EngineClosedError, EngineDeadError
from radixcache.runtime.testing import RandomModel, hold_engine_loop
from tests.runtime.faults.conftest import assert_clean, ids


class Boom(RuntimeError):
    pass


def _engine(tiny: RandomModel, **kw: Any) -> Engine:
    return Engine(tiny, **{"capacity_blocks": 64, "page_size": 16, "dtype": "float64", **kw})


def _alone(tiny: RandomModel, prompts: list[list[int]], n: int) -> list[tuple[int, ...]]:
    with _engine(tiny) as engine:
        return [engine.generate(p, n, ignore_eos=True).token_ids for p in prompts]


class CancelledAtTheSet(Future):  # type: ignore[type-arg]
    """A caller that cancels exactly between the loop's last look at the future and its set: the set finds the
    future cancelled (InvalidStateError), whatever the loop checked before."""

    def set_result(self, result: object) -> None:
        self.cancel()
        super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        self.cancel()
        super().set_exception(exception)


@pytest.mark.parametrize("outcome", ["result", "error"])
def test_a_future_cancelled_between_check_and_set_leaves_the_loop_running(tiny: RandomModel, outcome: str) -> None:
    prompts = [ids(20, 1), ids(24, 2)]
    alone = _alone(tiny, prompts[1:], 30)
    engine = _engine(tiny)
    release = hold_engine_loop(engine)
    try:
        racy = engine.submit(prompts[0], 5, ignore_eos=True)  # leaves first, while the other decodes
        racy.future = CancelledAtTheSet()
        if outcome == "error":
            racy.request.sampler.sample = lambda *a: (_ for _ in ()).throw(Boom("sampler"))  # type: ignore[method-assign]
            racy.request.sampler.params = racy.request.sampler.params.__class__(max_new_tokens=5, temperature=0.5)
        other = engine.submit(prompts[1], 30, ignore_eos=True)
    finally:
        release()
    assert other.result(60).token_ids == alone[0]
    with pytest.raises(CancelledError):
        racy.result(5)
    assert engine.generate(prompts[1], 30, ignore_eos=True).token_ids == alone[0]  # the loop still serves
    assert_clean(engine)


def test_a_cancelled_future_aborts_its_request_and_frees_its_blocks(tiny: RandomModel) -> None:
    engine = _engine(tiny)
    started = threading.Event()
    handle = engine.submit(ids(20, 3), 400, ignore_eos=True)
    handle.request.listener = lambda r: started.set()
    assert started.wait(30)
    assert handle.future.cancel()  # the caller's side only: an asyncio.wrap_future waiter that was cancelled
    assert engine.wait_idle(30)
    assert len(handle.request.output_ids) < 400 and handle.request.finish_reason == "cancelled"
    assert_clean(engine)


def test_a_loop_thread_that_dies_makes_every_later_call_say_so(tiny: RandomModel, monkeypatch: Any) -> None:
    engine = _engine(tiny)
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))  # the expected death
    release = hold_engine_loop(engine)
    handle = engine.submit(ids(20, 4), 50, ignore_eos=True)
    calls = {"n": 0}

    def broken() -> bool:  # a bug in the loop itself, outside every per-request guard
        calls["n"] += 1
        if calls["n"] >= 3:
            raise Boom("the loop broke")
        return True

    monkeypatch.setattr(engine.scheduler, "has_work", broken)
    release()
    with pytest.raises((Boom, EngineDeadError)):
        handle.result(30)
    for thread in threading.enumerate():  # let it finish dying within this test
        if thread.name == "radixcache-engine":
            thread.join(30)
    assert [str(e) for e in died] == ["the loop broke"]  # the dying thread reports the bug
    for call in (
        lambda: engine.generate(ids(10, 5), 3),
        lambda: engine.check(5),
        lambda: engine.submit(ids(10, 6), 3),
    ):
        with pytest.raises(EngineDeadError, match="the loop broke"):
            call()


def test_step_raising_outside_the_runner_fails_the_requests_in_flight_and_the_engine_serves_on(
    tiny: RandomModel, monkeypatch: Any
) -> None:
    prompts = [ids(20, 7), ids(30, 8)]
    alone = _alone(tiny, prompts, 12)
    engine = _engine(tiny)
    real = engine.scheduler._schedule_decodes
    calls = {"n": 0}

    def broken() -> list[Any]:
        calls["n"] += 1
        if calls["n"] == 4:
            raise Boom("scheduler bug")
        return real()

    monkeypatch.setattr(engine.scheduler, "_schedule_decodes", broken)
    handles = engine.submit(prompts, 12, ignore_eos=True)
    for h in handles:
        with pytest.raises(Boom):
            h.result(30)
    assert_clean(engine)
    assert [r.token_ids for r in engine.generate(prompts, 12, ignore_eos=True)] == alone


def test_admit_raising_fails_only_that_request(tiny: RandomModel, monkeypatch: Any) -> None:
    prompts = [ids(20, 9), ids(30, 10)]
    alone = _alone(tiny, prompts, 10)
    engine = _engine(tiny)
    engine.generate(prompts[0][:16] + ids(4, 11), 2)  # something cached: the victim's match locks a node
    real = engine.kv.admit
    victim_rid: list[int] = []

    def admit(kv: Any, *a: Any, **k: Any) -> bool:
        if kv.rid in victim_rid:
            real(kv, *a, **k)  # it matched, locked and allocated: then the fault
            raise Boom("admission")
        return real(kv, *a, **k)

    monkeypatch.setattr(engine.kv, "admit", admit)
    release = hold_engine_loop(engine)
    try:
        handles = engine.submit(prompts, 10, ignore_eos=True)
        victim = engine.submit(prompts[0][:16] + ids(8, 12), 10, ignore_eos=True)
        victim_rid.append(victim.rid)
    finally:
        release()
    with pytest.raises(Boom):
        victim.result(30)
    assert [h.result(30).token_ids for h in handles] == alone
    assert_clean(engine)


@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_a_listener_raising_fails_only_its_request(tiny: RandomModel, exc: type[BaseException]) -> None:
    prompts = [ids(20, 13), ids(25, 14)]
    alone = _alone(tiny, prompts, 15)
    engine = _engine(tiny)
    release = hold_engine_loop(engine)
    try:
        handles = engine.submit(prompts, 15, ignore_eos=True)
        victim = engine.submit(ids(18, 15), 15, ignore_eos=True)

        def listener(r: Any) -> None:
            if len(r.output_ids) == 3:
                raise exc("listener")

        victim.request.listener = listener
    finally:
        release()
    with pytest.raises(exc):
        victim.result(30)
    assert len(victim.request.output_ids) == 3
    assert [h.result(30).token_ids for h in handles] == alone
    assert_clean(engine)


def test_a_prompt_that_fits_the_pool_but_not_beside_pinned_blocks_is_cache_full(tiny: RandomModel) -> None:
    engine = _engine(tiny, capacity_blocks=8, max_pinned_fraction=0.75)
    pinned = ids(80, 16)
    assert engine.generate(pinned, 2, pin=True).pinned_tokens == 80  # 5 pages locked by the pin
    with pytest.raises(CacheFullError, match="beside pinned"):
        engine.generate(ids(60, 17), 2)  # 4 pages: fits the pool of 8, not the 3 beside the pin
    assert engine.cache.locked_blocks == engine.stats.pinned_blocks == 5
    assert_clean(engine)
    assert engine.unpin(pinned) == 1
    assert engine.cache.locked_blocks == 0
    assert len(engine.generate(ids(60, 17), 2, ignore_eos=True).token_ids) == 2
    assert_clean(engine)


@pytest.mark.parametrize("where", ["prefill", "decode"])
def test_a_pass_that_fails_because_of_one_request_is_retried_and_fails_only_it(
    tiny: RandomModel, monkeypatch: Any, where: str
) -> None:
    """A forward pass that raises for one request's sake (say its input trips the model) is retried once for each
    of its requests alone: the others of that pass go on with their outputs unchanged, only that one fails."""
    prompts = [ids(20, 18), ids(26, 19)]
    alone = _alone(tiny, prompts, 12)
    engine = _engine(tiny)
    real, victim_rid = engine.runner.step, []

    def step(decodes: list[Any], chunks: list[Any]) -> Any:
        mine = [r for r in decodes if r.rid in victim_rid] if where == "decode" else []
        mine += [r for r, _ in chunks if r.rid in victim_rid] if where == "prefill" else []
        if mine and (where == "prefill" or len(mine[0].output_ids) >= 3):
            raise Boom("this request's pass")
        return real(decodes, chunks)

    monkeypatch.setattr(engine.runner, "step", step)
    release = hold_engine_loop(engine)
    try:
        handles = engine.submit(prompts, 12, ignore_eos=True)
        victim = engine.submit(ids(22, 20), 12, ignore_eos=True)
        victim_rid.append(victim.rid)
    finally:
        release()
    with pytest.raises(Boom):
        victim.result(30)
    assert [h.result(30).token_ids for h in handles] == alone
    assert_clean(engine)


def test_a_thread_count_torch_refuses_on_the_loop_thread_fails_its_callers(tiny: RandomModel, monkeypatch: Any) -> None:
    """The loop thread sets its torch thread count as it starts: where torch refuses it (as 2**31 threads raised
    "Overflow when unpacking long"), the loop dies and says so (EngineDeadError), never leaving a caller waiting."""
    import torch

    engine = _engine(tiny)
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))  # the expected death
    set_threads = torch.set_num_threads

    def refused(n: int) -> None:
        if threading.current_thread().name == "radixcache-engine":
            raise ValueError("Overflow when unpacking long")
        set_threads(n)

    monkeypatch.setattr(torch, "set_num_threads", refused)
    handle = engine.submit(ids(20, 4), 5, ignore_eos=True)
    with pytest.raises(EngineDeadError, match="Overflow when unpacking long"):
        handle.result(30)
    assert engine.wait_idle(30)
    assert [str(e) for e in died] == ["Overflow when unpacking long"]
    with pytest.raises(EngineDeadError):
        engine.generate(ids(10, 5), 3)


def test_a_done_callback_that_waits_for_the_engine_is_refused_instead_of_hanging_it(tiny: RandomModel) -> None:
    """A request's future completes on the engine loop thread, so its done-callbacks run there; one that chained the
    next call with generate() (an agent's next step) waited for the loop from the loop: every request in flight
    and every later one hung for ever, and close() could not stop it."""
    prompts = [ids(12, 40), ids(14, 41)]
    alone = _alone(tiny, prompts, 6)
    engine = _engine(tiny)
    seen: dict[str, Any] = {}

    def next_step(_: Future) -> None:
        for name, wait in [
            ("generate", lambda: engine.generate(prompts[1], 6, ignore_eos=True)),
            ("unpin", engine.unpin),
            ("check", engine.check),
        ]:
            try:
                seen[name] = wait()
            except RuntimeError as exc:
                seen[name] = exc

    # Each callback is added while the loop is held: a request that completed first would run it on this thread.
    release = hold_engine_loop(engine)
    first = engine.submit(prompts[0], 6, ignore_eos=True)
    first.future.add_done_callback(next_step)
    release()
    assert first.result(30).token_ids == alone[0]
    assert engine.submit(prompts[1], 6, ignore_eos=True).result(30).token_ids == alone[1]  # the loop still serves
    for name in ("generate", "unpin", "check"):
        assert isinstance(seen[name], RuntimeError) and "engine loop's own thread" in str(seen[name]), name
    assert_clean(engine)

    release = hold_engine_loop(engine)
    closing = engine.submit(prompts[0], 6, ignore_eos=True)
    closing.future.add_done_callback(lambda _: seen.setdefault("close", engine.close(5)))
    release()
    closing.result(30)
    assert engine.wait_idle(30) and seen["close"] is False  # it could not wait for itself, and said so
    with pytest.raises(EngineClosedError):
        engine.submit(prompts[0], 2)


class CallerExit(BaseException):  # past concurrent.futures' guard of done-callbacks, which stops only Exception
    pass


@pytest.mark.parametrize("exc", [SystemExit, CallerExit])
def test_a_done_callback_raising_a_base_exception_is_the_callers_alone(
    tiny: RandomModel, exc: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    """A request's done-callbacks run on the engine loop thread, inside its set; one that raised a BaseException
    (sys.exit() in an agent's last-step hook) escaped the set and killed the loop thread: the other requests in
    flight and every later call failed with EngineDeadError."""
    prompts = [ids(12, 50), ids(22, 51)]
    alone = _alone(tiny, prompts, 12)
    engine = _engine(tiny)
    release = hold_engine_loop(engine)
    try:
        first = engine.submit(prompts[0], 3, ignore_eos=True)  # leaves while the other decodes
        other = engine.submit(prompts[1], 12, ignore_eos=True)
        first.future.add_done_callback(lambda _: (_ for _ in ()).throw(exc("hook")))
    finally:
        release()
    assert first.result(30).token_ids == alone[0][:3]
    assert other.result(30).token_ids == alone[1]
    assert engine.generate(prompts[0], 12, ignore_eos=True).token_ids == alone[0]  # the engine serves on
    assert any("done-callback" in r.getMessage() for r in caplog.records)
    assert_clean(engine)


def test_the_done_callbacks_after_one_raising_a_base_exception_still_run(tiny: RandomModel) -> None:
    """concurrent.futures stops running a future's callbacks at one that raises past Exception: the callbacks after it
    (an agenerate's asyncio waiter, the server's wake-up) never ran, and their callers waited for ever."""
    engine = _engine(tiny)
    release = hold_engine_loop(engine)
    ran: list[str] = []
    try:
        handle = engine.submit(ids(12, 50), 3, ignore_eos=True)
        handle.future.add_done_callback(lambda _: (_ for _ in ()).throw(SystemExit("hook")))
        handle.future.add_done_callback(lambda _: ran.append("after"))
    finally:
        release()

    async def awaited() -> int:
        return len((await asyncio.wrap_future(handle.future)).token_ids)

    assert asyncio.run(asyncio.wait_for(awaited(), 30)) == 3
    assert ran == ["after"]
    assert_clean(engine)
