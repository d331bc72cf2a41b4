"""The Python API refuses a text that cannot fit under the model's `max_position` before tokenising it
(runtime.loading.prompt_bound), as the server does: an agent's tool result of megabytes (a binary file read as
text, a log) held the GIL while it was tokenised (4 MB: 3 s, every stream of the engine stalled as long), only to
be refused. The refusal names the sizes; the tokenizer's own count confirms the text could not have fit; a text
that fits runs as before."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.engine import request_builder
from radixcache.runtime.engine.errors import ContextLengthError
from radixcache.runtime.loading.tokenizer import Tokenizer
from radixcache.runtime.testing import RandomModel, tiny_model

CONTEXT = 256
LONG = "ls -la\x00\x01 \n" * 500  # 5,000 bytes of binary-ish text: past 255 tokens of at most 12 bytes each
CALL = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
HISTORY = [{"role": "user", "content": "list the files"}, {"role": "assistant", "content": None, "tool_calls": [CALL]}]


@pytest.fixture
def engine(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, list[int]]]:
    from tests.cli.conftest import write_tiny_checkpoint

    tokenizer = Tokenizer.from_hf_dir(write_tiny_checkpoint(tmp_path / "tiny"))  # byte-level BPE, ChatML specials
    m = tiny_model(seed=2, vocab_size=260, max_position=CONTEXT)
    with Engine(RandomModel(m.config, m.weights, tokenizer), capacity_blocks=64, page_size=16, threads=1) as eng:
        seen: list[int] = []  # the lengths of the texts handed to the tokenizer
        real = tokenizer.encode

        def encode(text: str, *args: Any, **kwargs: Any) -> list[int]:
            seen.append(len(text))
            return real(text, *args, **kwargs)

        monkeypatch.setattr(tokenizer, "encode", encode)
        yield eng, seen


def _never_tokenised(seen: list[int]) -> None:
    assert all(n < len(LONG) for n in seen), seen


def test_a_text_past_the_context_is_refused_untokenised_naming_the_sizes(engine: Any) -> None:
    eng, seen = engine
    assert len(eng.tokenizer.backend.encode(LONG).ids) >= CONTEXT  # the tokenizer's own count: it cannot fit
    with pytest.raises(ValueError, match=rf"prompt of 5,000 bytes of text .* max_position {CONTEXT}: .* 12 bytes") as e:
        eng.generate(LONG, 4)
    assert isinstance(e.value, ContextLengthError) and (e.value.size, e.value.limit, e.value.unit) == (
        5000,
        256,
        "bytes",
    )
    _never_tokenised(seen)
    r = eng.generate("ls -la " * 20, 2, ignore_eos=True)  # a text that fits runs as before
    assert r.prompt_tokens == 140 and len(r.token_ids) == 2


def test_an_agents_huge_tool_result_is_refused_untokenised_and_the_session_kept(engine: Any) -> None:
    eng, seen = engine
    session = eng.session(messages=HISTORY, max_new_tokens=2)
    before = [dict(m) for m in session.messages]
    with pytest.raises(ValueError, match=rf"prompt of 5,[0-9]{{3}} bytes of text .* max_position {CONTEXT}"):
        session.send_tool_results({"call_1": LONG})
    with pytest.raises(ValueError, match=rf"prompt of 5,[0-9]{{3}} bytes of text .* max_position {CONTEXT}"):
        eng.chat([*HISTORY, {"role": "tool", "tool_call_id": "call_1", "content": LONG}], 2)
    _never_tokenised(seen)
    assert session.messages == before  # the turn was refused: the agent may cut the result and send it again
    r = session.send_tool_results({"call_1": "a.txt b.txt"}, ignore_eos=True)
    assert len(r.token_ids) == 2 and session.messages[-2]["content"] == "a.txt b.txt"


def test_a_fork_continuation_past_the_context_is_refused_untokenised(engine: Any) -> None:
    eng, seen = engine
    with pytest.raises(ValueError, match=r"continuations\[1\] of 5,000 bytes of text"):
        eng.fork("hello", continuations=[" a", LONG], max_new_tokens=2)
    _never_tokenised(seen)


def test_a_text_no_bound_refuses_never_reckons_the_tokenizers(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound reads the whole vocabulary once (0.5 s for SmolLM2's, the GIL held): a text of at most 4 bytes a
    token of the context passes every bound, so its first prompt past the context in characters paid it for nothing."""
    eng, _ = engine
    calls: list[int] = []
    real = request_builder.token_bytes_bound
    monkeypatch.setattr(request_builder, "token_bytes_bound", lambda tok: calls.append(1) or real(tok))
    with pytest.raises(ContextLengthError) as e:
        eng.generate("ls -la " * 60, 1)  # 420 characters, past 256 tokens, under 255 x 4 bytes: tokenised, counted
    assert (e.value.size, e.value.unit) == (420, "tokens") and calls == []
    with pytest.raises(ContextLengthError, match="bytes of text"):
        eng.generate(LONG, 1)
    assert calls == [1]
