"""Every request of a call is checked before any is queued: one bad prompt or option in a batch, group or fork
refuses the whole call, and nothing runs, nothing is cached, nothing is counted."""

from __future__ import annotations

import asyncio
import re

import pytest

from radixcache.runtime import Engine, RequestOptions
from radixcache.runtime.engine.errors import RequestTooLargeError
from radixcache.runtime.engine.sampling import SamplingParams
from radixcache.runtime.grammar.errors import GrammarError
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


def test_a_sampling_keyword_beside_params_is_refused_by_name_not_dropped(tiny: RandomModel) -> None:
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    with pytest.raises(ValueError, match=r"Engine.generate: temperature given beside params="):
        RequestOptions.of(params=params, temperature=1.0)
    with pytest.raises(ValueError, match=r"max_new_tokens given beside params="):
        RequestOptions.of(5, params=params)
    with pytest.raises(ValueError, match=r"RequestOptions.updated: seed given beside params="):
        RequestOptions.of(8).updated(params=params, seed=2)
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    with pytest.raises(ValueError, match=r"Engine.generate: seed given beside params="):
        engine.generate([1, 2, 3], params=params, seed=1)
    with pytest.raises(ValueError, match=r"Engine.submit: max_new_tokens given beside params="):
        engine.submit([1, 2, 3], 9, options=RequestOptions.of(4), params=params)
    with pytest.raises(ValueError, match=r"Engine.session: top_k given beside params="):
        engine.session(params=params, top_k=5)
    assert_untouched(engine)
    assert len(engine.generate([1, 2, 3], params=params).token_ids) == 3  # params alone: its own max_new_tokens
    assert len(engine.generate([1, 2, 3], options=RequestOptions.of(9), params=params).token_ids) == 3


def test_a_bad_each_entry_of_submit_group_is_named_by_its_index_and_field(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    prompts = [[1, 2, 3]] * 3
    cases = [
        ({"caller": "x"}, TypeError, "each[1]: Engine.submit_group() got an unexpected keyword argument 'caller'"),
        ({7: 1}, TypeError, "each[1]: Engine.submit_group() got an unexpected keyword argument 7"),
        ({"colour": 1}, TypeError, "each[1]: Engine.submit_group() got an unexpected keyword argument 'colour'"),
        ({"top_p": 0.0}, ValueError, "each[1]: top_p must be in"),
        ({"seed": True}, ValueError, "each[1]: seed"),
    ]
    for entry, kind, message in cases:
        with pytest.raises(kind, match=re.escape(message)):
            engine.submit_group(prompts, 4, each=[{"seed": 1}, entry, {"seed": 3}])
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    with pytest.raises(GrammarError, match=re.escape("each[2].response_format.json_schema.schema")) as bad:
        engine.submit_group(prompts, 4, each=[{}, {}, {"response_format": schema}])
    assert bad.value.path.startswith("each[2].response_format.json_schema.schema")
    assert_untouched(engine)


def test_without_a_cache_a_pin_pins_nothing_and_is_checked_as_with_one(tiny: RandomModel) -> None:
    """docs/api.md: enable_cache=False takes and refuses the same arguments (a `compare`'s two runs agree); a pin
    there pins nothing, which the result says."""
    for cache in (True, False):
        engine = Engine(tiny, capacity_blocks=64, page_size=4, max_pinned_fraction=0.25, enable_cache=cache)
        with pytest.raises(ValueError, match=r"pinning 79 tokens exceeds the pinned share of the pool \(16 pages\)"):
            engine.generate(list(range(1, 80)), 2, pin=True)
        assert_untouched(engine)
        assert engine.generate(list(range(1, 17)), 2, pin=True).pinned_tokens == (16 if cache else 0)
        assert engine.stats.pinned_blocks == (4 if cache else 0)


def test_unpin_releases_the_pins_made_for_that_prompt_not_a_shorter_prompts(tiny: RandomModel) -> None:
    """An agent pins a shared system prompt once, and each conversation its own prompt: ending one conversation
    (unpin of its prompt) released the system prompt's pin too, whose tokens begin it."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4, max_pinned_fraction=0.5)
    system = list(range(1, 17))
    chat_a, chat_b = [*system, 20, 21, 22, 23, 24], [*system, 30]  # b's whole pages are the system prompt's
    for prompt in (system, chat_a, chat_b, chat_b):  # b twice: one pin of b
        assert engine.generate(prompt, 1, pin=True).pinned_tokens == len(prompt) // 4 * 4
    assert engine.stats.pinned_blocks == 5
    assert engine.unpin(chat_a) == 1 and engine.unpin(chat_a) == 0
    assert engine.unpin(chat_b) == 1 and engine.stats.pinned_blocks == 4, "the system prompt's pin holds its pages"
    engine.cache.evict(engine.cache.evictable_blocks)
    assert engine.cache.peek(chat_a).length == 16, "its pages survive eviction, the rest does not"
    assert engine.unpin(system) == 1 and engine.stats.pinned_blocks == 0 and engine.cache.locked_blocks == 0
    engine.cache.check_invariants()


def test_unpin_of_a_forks_prefix_releases_every_branchs_pin(tiny: RandomModel) -> None:
    engine = Engine(tiny, capacity_blocks=64, page_size=4, max_pinned_fraction=0.5)
    prefix = list(range(1, 11))
    branches = engine.fork(
        prefix, continuations=[[40, 41, 42], [50], [60, 61, 62, 63, 64, 65]], max_new_tokens=1, pin=True
    )
    assert [r.pinned_tokens for r in branches] == [12, 8, 16]
    assert engine.generate(prefix, 1, pin=True).pinned_tokens == 8  # the [50] branch's pages, for the same prompt
    assert engine.unpin(prefix) == 3 and engine.stats.pinned_blocks == 0 and engine.cache.locked_blocks == 0


@pytest.mark.parametrize("prompt", [{30, 1, 2}, frozenset({5, 70}), {(1, 2), (3, 4, 5)}, [[1, 2], {30, 1}]])
def test_an_unordered_prompt_or_batch_is_refused_not_reordered(tiny: RandomModel, prompt: object) -> None:
    """A set iterates in its own order: {30, 1, 2} ran as the prompt [1, 2, 30], and a set of prompts returned its
    results in an order the caller could not pair with the prompts."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    with pytest.raises(ValueError, match=r"a prompt must be text.* got (set|frozenset) "):
        engine.submit(prompt, 2)
    with pytest.raises(ValueError, match=r"got (set|frozenset) "):
        engine.submit_group(prompt, 2)
    assert_untouched(engine)


def test_a_stop_token_id_outside_the_vocabulary_is_refused_as_a_logit_bias_id_is(tiny: RandomModel) -> None:
    """A stop id past the vocabulary can never be sampled: it was taken and never stopped anything."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    message = re.escape("stop_token_ids id 1000000 is outside the vocabulary [0, 97)")
    with pytest.raises(ValueError, match=message):
        engine.generate([[1, 2], [3, 4]], 2, stop_token_ids=[5, 10**6])
    with pytest.raises(ValueError, match=message):
        engine.submit_group([[1, 2]], 2, each=[{"stop_token_ids": [10**6]}])
    assert_untouched(engine)


def test_caller_given_to_an_entry_point_is_an_unknown_keyword_naming_that_call(tiny: RandomModel) -> None:
    """`caller` labels the options' errors; given to a call it was Python's "RequestOptions.of() got multiple values
    for keyword argument 'caller'", naming neither the call nor that it takes no such keyword."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    session = engine.session()
    calls = {
        "Engine.generate": lambda: engine.generate([1, 2], 2, caller="x"),
        "Engine.submit": lambda: engine.submit([1, 2], 2, options=RequestOptions.of(2), caller="x"),
        "Engine.fork": lambda: engine.fork([1, 2], 2, 2, caller="x"),
        "Engine.unpin": lambda: engine.unpin([1, 2], caller="x"),
        "Engine.agenerate": lambda: asyncio.run(engine.agenerate([1, 2], 2, caller="x")),
        "Session.send": lambda: session.send("hi", caller="x"),
        "Session.fork": lambda: session.fork(2, caller="x"),
        "Session.asend": lambda: asyncio.run(session.asend("hi", caller="x")),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match=re.escape(f"{name}() got an unexpected keyword argument 'caller'")):
            call()
    assert_untouched(engine)


def test_unpin_of_a_namespace_alone_releases_that_namespaces_pins_only(tiny: RandomModel) -> None:
    """A tenant's unpin(namespace=t) released every tenant's pins, as unpin() does."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4, max_pinned_fraction=0.5)
    prompt = list(range(1, 9))
    for namespace in ("a", "b", None):
        assert engine.generate(prompt, 1, pin=True, namespace=namespace).pinned_tokens == 8
    assert engine.unpin(namespace="a") == 1 and engine.stats.pinned_blocks == 4
    assert engine.unpin(options=RequestOptions.of(namespace="b")) == 1 and engine.stats.pinned_blocks == 2
    assert engine.unpin(namespace="a") == 0
    assert engine.generate(prompt, 1, pin=True, namespace="a").pinned_tokens == 8
    assert engine.unpin() == 2 and engine.stats.pinned_blocks == 0 and engine.cache.locked_blocks == 0


def test_a_bad_fork_continuation_is_named_by_its_index(tiny: RandomModel) -> None:
    """The error "continuation[0] must be a token id" named the token's index inside the second continuation, not
    which continuation; an id past the vocabulary named neither."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    with pytest.raises(ValueError, match=re.escape("continuations[1][0] must be a token id (an integer), got bool")):
        engine.fork([1, 2], continuations=[[5], [True]], max_new_tokens=2)
    with pytest.raises(ValueError, match=re.escape("continuations[2]: token id 1000 is outside the vocabulary")):
        engine.fork([1, 2], continuations=[[5], "ab", [6, 1000]], max_new_tokens=2)
    with pytest.raises(ValueError, match=re.escape("continuations[1] must be text or a sequence of token ids")):
        engine.fork([1, 2], continuations=[[5], 7], max_new_tokens=2)
    assert_untouched(engine)


def test_a_bad_prompt_of_a_batch_is_named_by_its_index(tiny: RandomModel) -> None:
    """A batch's errors ("the prompt is empty", "prompt[1] must be a token id" with the token's index, "token id 1000
    is outside the vocabulary") said not which prompt of many (a trace's, say) was refused."""
    engine = Engine(tiny, capacity_blocks=16, page_size=4)
    cases = [
        ([[1, 2], []], ValueError, "prompts[1]: the prompt is empty"),
        ([[1, 2], [3, True]], ValueError, "prompts[1]: prompt[1] must be a token id (an integer), got bool True"),
        ([[1, 2], [3], [4, 1000]], ValueError, "prompts[2]: token id 1000 is outside the vocabulary [0, 97)"),
        ([[1, 2], [2] * 100], RequestTooLargeError, f"prompts[1]: {TOO_LARGE}"),
    ]
    for batch, kind, message in cases:
        with pytest.raises(kind, match=re.escape(message)):
            engine.generate(batch, 2)
        with pytest.raises(kind, match=re.escape(message)):
            engine.submit_group(batch, 2)
    with pytest.raises(ValueError, match=re.escape("continuations[1]: pinning 64 tokens exceeds the pinned share")):
        engine.fork([1] * 4, continuations=[[2], [3] * 60], max_new_tokens=2, pin=True)
    with pytest.raises(ValueError, match=r"^the prompt is empty$"):  # one prompt: as it was
        engine.generate([], 2)
    assert_untouched(engine)


def test_a_keyword_a_session_method_does_not_take_names_that_method(tiny: RandomModel) -> None:
    """`session.send("hi", n=2)` said "Session() got an unexpected keyword argument 'n'", naming the constructor
    (n replies to a history are `fork`'s)."""
    engine = Engine(tiny, capacity_blocks=64, page_size=4)
    session = engine.session()
    with pytest.raises(TypeError, match=re.escape("Session.send() got an unexpected keyword argument 'n'")):
        session.send("hi", n=2)
    with pytest.raises(TypeError, match=re.escape("Session.fork() got an unexpected keyword argument 'colour'")):
        session.fork(2, colour=1)
    assert session.messages == [] and session.results == []
    assert_untouched(engine)
