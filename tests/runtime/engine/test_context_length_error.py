"""A prompt that reaches the model's context is a ContextLengthError (a ValueError, as before) carrying its sizes, so an
agent loop tells it from its own mistakes, cuts its history and goes on: the engine, a batch (named `prompts[i]`), a
session, the replicas' front door and the server's status all say the same. After the cut, the system prompt's pages
are still read from the cache."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.cluster.limits import check_model_limits
from radixcache.runtime.engine.errors import ContextLengthError
from radixcache.runtime.server.errors import api_error_for
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

CONTEXT, PAGE = 160, 4
SYSTEM = "you answer from the tool output."


@pytest.fixture(scope="module")
def engine() -> Engine:
    m = tiny_model(seed=5, max_position=CONTEXT)
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    with Engine(model, capacity_blocks=128, page_size=PAGE, threads=1) as eng:
        yield eng


def test_a_prompt_at_the_context_is_a_context_length_error_with_its_sizes(engine: Engine) -> None:
    with pytest.raises(ContextLengthError) as caught:
        engine.generate([5] * CONTEXT, 2)
    err = caught.value
    assert isinstance(err, ValueError) and (err.size, err.limit, err.unit) == (CONTEXT, CONTEXT, "tokens")
    assert str(err) == f"prompt of {CONTEXT} tokens leaves no room under the model's max_position {CONTEXT}"
    with pytest.raises(ContextLengthError, match=r"^prompts\[1\]: prompt of 200 tokens") as caught:
        engine.generate([[5] * 3, [5] * 200], 2)
    assert (caught.value.size, caught.value.limit) == (200, CONTEXT)
    assert engine.generate([5] * (CONTEXT - 1), 8, ignore_eos=True).finish_reason == "length"  # the last position


def test_an_agent_cuts_its_history_on_the_error_and_the_system_prompt_stays_cached(engine: Engine) -> None:
    session = engine.session(system=SYSTEM, max_new_tokens=4, ignore_eos=True)
    turns = 0
    with pytest.raises(ContextLengthError) as caught:
        while turns < 20:
            session.send(f"tool output {turns}: " + "x" * 4)
            turns += 1
    assert turns >= 2 and caught.value.limit == CONTEXT and caught.value.size >= CONTEXT
    assert len(session.messages) == 1 + 2 * turns  # the refused turn left the history as it was
    del session.messages[1:-2]  # keep the system prompt and the latest turn
    r = session.send("tool output again")
    tok = engine.tokenizer
    system_ids = tok.encode(tok.apply_chat_template([{"role": "system", "content": SYSTEM}], False))
    assert r.cached_tokens >= len(system_ids) // PAGE * PAGE > 0  # its whole pages, cached since the first turn


def test_the_front_door_and_the_server_say_the_same() -> None:
    config = SimpleNamespace(max_position=CONTEXT, vocab_size=97)
    sampling = SimpleNamespace(logit_bias=(), stop_token_ids=())
    with pytest.raises(ContextLengthError, match=f"prompt of {CONTEXT + 1} tokens") as caught:
        check_model_limits(config, [5] * (CONTEXT + 1), sampling)  # type: ignore[arg-type]
    error = api_error_for(caught.value)
    assert (error.status, error.code) == (400, "context_length_exceeded")
