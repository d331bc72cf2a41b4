"""A session turn cut short ("cancelled" by close() or a cancel, "timeout" by its timeout) keeps the partial reply in
the history, as chat UIs keep a stopped reply's text: the assistant message holds exactly the text the result
returned, after the user turn it answered, and the history renders for the next turn (docs/api.md)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine.request import GenerationResult
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model


def _model() -> RandomModel:
    m = tiny_model(seed=7, max_position=40_000)
    return RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))


def _assert_kept(session_messages: list[dict], result: GenerationResult, user: str, decode) -> None:
    assert session_messages[-2] == {"role": "user", "content": user}
    assert session_messages[-1] == {"role": "assistant", "content": result.text}
    assert result.text == decode(list(result.token_ids)), "the history holds what generate returned"


def test_a_turn_cut_by_close_keeps_its_partial_reply() -> None:
    model = _model()
    engine = Engine(model, capacity_blocks=2600, page_size=16, threads=1)
    session = engine.session(system="be brief", max_new_tokens=30_000, ignore_eos=True)
    got: list[GenerationResult] = []
    sender = threading.Thread(target=lambda: got.append(session.send("hello there")), daemon=True)
    sender.start()
    while not any(len(r.output_ids) >= 3 for r in engine.scheduler.decoding):  # generating now
        time.sleep(0.01)
    assert engine.close(60)
    sender.join(60)
    (result,) = got
    assert result.finish_reason == "cancelled" and len(result.token_ids) >= 3
    _assert_kept(session.messages, result, "hello there", model.tokenizer.decode)
    assert session.results == [result]
    with Engine(model, capacity_blocks=2600, page_size=16, threads=1) as again:  # the history goes on elsewhere
        later = type(session)(again, messages=session.messages, max_new_tokens=2)
        assert later.send("go on").finish_reason == "length"
        assert later.messages[:-2] == session.messages


def test_a_turn_cut_by_its_timeout_keeps_its_partial_reply() -> None:
    model = _model()
    with Engine(model, capacity_blocks=2600, page_size=16, threads=1) as engine:
        session = engine.session(max_new_tokens=30_000, ignore_eos=True, timeout=0.5)
        result = session.send("hi")
        assert result.finish_reason == "timeout"
        _assert_kept(session.messages, result, "hi", model.tokenizer.decode)
        assert session.send("and?", timeout=None, max_new_tokens=2).finish_reason == "length"
        assert [m["role"] for m in session.messages] == ["user", "assistant", "user", "assistant"]


def test_cancelling_the_task_awaiting_asend_keeps_neither_the_turn_nor_a_reply() -> None:
    with Engine(_model(), capacity_blocks=2600, page_size=16, threads=1) as engine:
        session = engine.session(max_new_tokens=30_000, ignore_eos=True)

        async def cancel_mid_reply() -> None:
            task = asyncio.ensure_future(session.asend("hi"))
            while not any(r.output_ids for r in engine.scheduler.decoding):  # generating now
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(asyncio.wait_for(cancel_mid_reply(), 60))
        assert session.messages == [] and session.results == []
        assert engine.wait_idle(60) and engine.check()["locked_blocks"] == 0
