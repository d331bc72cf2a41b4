"""A Session's pins (tiny checkpoint, 256 pages of 16 tokens: a pinned share of 64 pages): the session holds one
pin, its latest pinned turn's, cut to the pinned share; `unpin()` and leaving a `with` block release it. Before,
every turn added a pin that nothing released but one `engine.unpin` per turn, and once the history passed the share
every turn raised "pinning ... tokens exceeds the pinned share of the pool"."""

from __future__ import annotations

import asyncio

import pytest

from radixcache.runtime import Engine
from tests.runtime.structured.conftest import PAGE

SHARE = 64  # pages: max_pinned_fraction 0.25 of 256


def _words(i: int) -> str:
    return " ".join(f"w{i}x{j}" for j in range(30))  # about 100 tokens


def _pinned_pages(prompt_tokens: int) -> int:
    """What a pin of the whole prompt holds, cut to the share: its whole pages."""
    return min(prompt_tokens // PAGE, SHARE)


def test_a_pinned_session_holds_one_pin_that_follows_its_latest_turn(engine: Engine) -> None:
    s = engine.session(system="sys", pin=True, max_new_tokens=20, ignore_eos=True)
    for i in range(12):
        r = s.send(_words(i))
        assert r.pinned_tokens == _pinned_pages(r.prompt_tokens) * PAGE
        assert engine.stats.pinned_blocks == _pinned_pages(r.prompt_tokens)  # one pin, not one per turn
        assert len(engine.kv.pins) == 1
    assert r.prompt_tokens // PAGE > SHARE  # the history did pass the share
    assert s.unpin() == 1 and engine.stats.pinned_blocks == 0 and len(engine.kv.pins) == 0


def test_async_turns_and_forks_replace_the_pin_too_and_a_with_block_releases_it(engine: Engine) -> None:
    with engine.session(system="sys", pin=True, max_new_tokens=4, ignore_eos=True) as s:

        async def turns() -> None:
            for i in range(2):
                await s.asend(_words(i))

        asyncio.run(turns())
        assert len(engine.kv.pins) == 1
        branches = s.fork(2, temperature=1.0, seed=1)
        assert engine.stats.pinned_blocks == _pinned_pages(branches[0].prompt_tokens)
    assert engine.stats.pinned_blocks == 0 and len(engine.kv.pins) == 0
    assert s.unpin() == 0


def test_a_turn_whose_pin_is_refused_keeps_the_earlier_pin(engine: Engine) -> None:
    """Another caller's pins hold the share: the turn runs, its pin refused (pinned_tokens 0, as documented), and
    the session's earlier pin stays until the session releases it."""
    s = engine.session(system="sys", pin=True, max_new_tokens=4, ignore_eos=True)
    first = s.send(_words(0))
    assert first.pinned_tokens > 0
    rest = SHARE - first.pinned_tokens // PAGE  # the share the session's pin leaves
    other = engine.generate(" ".join(f"o{j}" for j in range(400)), 1, pin=rest * PAGE)
    assert other.pinned_tokens == rest * PAGE
    second = s.send(_words(1))  # its prompt holds more pages than the first's: past the share with the other pin
    assert second.pinned_tokens == 0 and second.finish_reason == "length"
    assert engine.stats.pinned_blocks == SHARE
    assert s.unpin() == 1 and engine.unpin() == 1 and engine.stats.pinned_blocks == 0


def test_a_turn_that_fails_after_its_pin_was_made_leaves_no_pin_the_session_forgets(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn whose request failed once its prompt was computed (its pin made) raised, and the session forgot the
    pin it may hold: nothing but `engine.unpin()` released it. A turn refused for its arguments pinned nothing."""
    from radixcache.runtime.engine.errors import SamplingError
    from radixcache.runtime.engine.sampling import Sampler

    s = engine.session(system="sys", pin=True, max_new_tokens=4, ignore_eos=True, temperature=1.0, seed=1)
    with pytest.raises(ValueError, match="lone surrogate"):
        s.send("a\ud800b")  # refused before it was queued
    sample = Sampler.sample

    def failing(self: Sampler, *args: object, **kwargs: object) -> int:
        raise SamplingError("the logits went non-finite (a stand-in)")

    monkeypatch.setattr(Sampler, "sample", failing)
    with pytest.raises(SamplingError):
        s.send(_words(0))
    assert engine.stats.pinned_blocks > 0  # its prompt was computed and pinned before the failure
    monkeypatch.setattr(Sampler, "sample", sample)
    assert s.unpin() == 1 and engine.stats.pinned_blocks == 0 and len(engine.kv.pins) == 0


def test_a_pin_made_again_for_the_same_history_is_kept(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine keeps one pin per prompt: a second fork of the same history (an agent sampling candidates again),
    or a turn retried after it failed once its pin was made, pinned the prompt the session already held, and the
    release of that earlier entry released the pin just made: `pinned_tokens` said it was pinned, the pool held
    nothing pinned, and `unpin()` found nothing."""
    from radixcache.runtime.engine.errors import SamplingError
    from radixcache.runtime.engine.sampling import Sampler

    s = engine.session(system="sys", pin=True, max_new_tokens=4, ignore_eos=True, temperature=1.0, seed=1)
    s.send(_words(0))
    first = s.fork(2, seed=1)
    again = s.fork(2, seed=5)
    assert again[0].pinned_tokens == first[0].pinned_tokens > 0
    assert engine.stats.pinned_blocks == _pinned_pages(again[0].prompt_tokens) and len(engine.kv.pins) == 1
    assert s.unpin() == 1 and engine.stats.pinned_blocks == 0

    sample = Sampler.sample

    def failing(self: Sampler, *args: object, **kwargs: object) -> int:
        raise SamplingError("the logits went non-finite (a stand-in)")

    monkeypatch.setattr(Sampler, "sample", failing)
    with pytest.raises(SamplingError):
        s.send(_words(1))  # its prompt computed and pinned before the failure
    monkeypatch.setattr(Sampler, "sample", sample)
    retried = s.send(_words(1))  # the user sends it again
    assert retried.pinned_tokens > 0
    assert engine.stats.pinned_blocks == _pinned_pages(retried.prompt_tokens) and len(engine.kv.pins) == 1
    assert s.unpin() == 1 and engine.stats.pinned_blocks == 0 and len(engine.kv.pins) == 0
    assert all(node.lock_ref == 0 for node in engine.cache.iter_nodes()) and engine.check()["locked_blocks"] == 0


def test_leaving_a_with_block_by_an_error_keeps_that_error_when_the_release_fails() -> None:
    """`with engine.session(pin=True) as s:` whose block raised while the engine had died: the release's
    EngineDeadError replaced the block's own error (the one that says what went wrong)."""
    from types import SimpleNamespace

    from radixcache.runtime.engine.errors import EngineDeadError
    from radixcache.runtime.engine.options import RequestOptions
    from radixcache.runtime.engine.session import Session, _Pin

    def unpin(prompt: object, options: object = None) -> int:
        raise EngineDeadError(RuntimeError("the engine loop died"))

    def session() -> Session:
        s = Session(SimpleNamespace(unpin=unpin), system="sys")  # type: ignore[arg-type]
        s._pins = [_Pin([{"role": "user", "content": "hi"}], RequestOptions())]  # as a pinned turn leaves it
        return s

    with pytest.raises(KeyError, match="the block's own"), session():
        raise KeyError("the block's own")
    with pytest.raises(EngineDeadError), session():  # with nothing raised in the block, the release's error is seen
        pass


def test_unpin_releases_the_pin_made_after_the_tool_memory_forgot_a_call_the_history_replays(engine: Engine) -> None:
    """A pinned agent session whose history replays a call the model wrote in its own spacing (the engine's tool
    memory renders that very text), then other tenants' calls push the entry out of the memory (bounded): the
    history rendered again gave the call's canonical text, other tokens than the pinned prompt's, so `unpin()`
    released nothing and the pin held its pages for ever. The session now names the ids the pin was made for."""
    import re

    from radixcache.runtime.grammar import GrammarSpec
    from radixcache.runtime.tools import ToolCallMemory
    from tests.runtime.structured.conftest import TOOLS

    store = engine.tool_memory._store
    engine.tool_memory._store = ToolCallMemory(max_entries=1)._store  # the engine's one memory, shrunk
    try:
        s = engine.session(system="sys", tools=TOOLS, pin=True, max_new_tokens=3, ignore_eos=True)
        raw = '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Oslo"}}]}'  # not the canonical spacing
        call = s.send("How warm is Oslo?", max_new_tokens=200, grammar=GrammarSpec.regex(re.escape(raw)))
        assert [c.name for c in call.tool_calls] == ["get_weather"]
        reply = s.send_tool_results({call.tool_calls[0].id: "5 C"})
        assert reply.pinned_tokens > 0 and len(engine.kv.pins) == 1
        for i in range(3):  # other tenants' agents, their calls remembered after the session's
            other = engine.chat(
                [{"role": "user", "content": f"weather {i}"}],
                tools=TOOLS,
                tool_choice="required",
                max_new_tokens=200,
                seed=i,
                namespace=f"tenant{i}",
            )
            assert other.tool_calls
        assert engine.tool_memory.lookup(call.tool_calls) is None  # the session's call is forgotten
        assert s.unpin() == 1
        assert len(engine.kv.pins) == 0 and engine.stats.pinned_blocks == 0
        gauges = engine.check()  # the cache's invariants, on the loop thread
        assert gauges["locked_blocks"] == 0 and gauges["pinned_blocks"] == 0
        assert all(node.lock_ref == 0 for node in engine.cache.iter_nodes())  # naive: nothing holds a lock now
        assert s.send("and now?").pinned_tokens > 0  # the session goes on
        assert s.unpin() == 1 and engine.check()["locked_blocks"] == 0
    finally:
        engine.tool_memory._store = store


def test_a_pinned_turn_after_the_history_was_cut_releases_the_pin_it_no_longer_extends() -> None:
    """An agent framework that cuts its context (drops a turn, rewrites it) and sends a shorter history: the
    session's pin of the old history held pages the new prompt does not share, so on a small pool the turn failed
    with CacheFullError (and, where it fit, its own pin was refused for the share the stale one held). Now the
    stale pin is released before the turn runs and the turn's own pin follows its prompt."""
    from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

    m = tiny_model(seed=7)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    page, share = 4, 8  # 32 pages of 4 tokens, a pinned share of 8 pages
    with Engine(model, capacity_blocks=32, page_size=page, threads=1) as small:
        s = small.session(pin=True, max_new_tokens=4, ignore_eos=True)
        first = s.send("a" * 60)
        assert first.pinned_tokens == share * page and small.stats.pinned_blocks == share
        del s.messages[-2:]  # the turn dropped; a longer one sent in its place: 31 of the 32 pages
        second = s.send("b" * 100)
        assert second.finish_reason == "length" and second.pinned_tokens == share * page
        (pinned,) = small.kv.pins._pins  # one pin: the new prompt's first pages, none of the old history's own
        assert list(pinned[1]) == list(second.pinned_for[: share * page])
        assert small.stats.pinned_blocks == share

        s.messages.clear()  # the context rewritten, the next turn on asyncio
        third = asyncio.run(s.asend("c" * 100))
        assert third.finish_reason == "length" and third.pinned_tokens == share * page
        (pinned,) = small.kv.pins._pins
        assert list(pinned[1]) == list(third.pinned_for[: share * page])
        s.messages.clear()  # the same messages again, in a namespace of their own: they share no page
        fourth = s.send("c" * 100, namespace="other")
        assert fourth.pinned_tokens == share * page and fourth.cached_tokens == 0
        ((namespace, _),) = small.kv.pins._pins
        assert namespace == "other" and small.stats.pinned_blocks == share
        assert s.unpin() == 1 and small.check()["locked_blocks"] == 0
