"""`unpin` takes what `chat(..., pin=True)` took: a messages list (it was a ValueError, 'prompt[0] must be a token
id', and only the rendered text released the pin), rendered with the same tools, in the same namespace."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixcache.runtime import Engine, RequestOptions
from radixcache.runtime.testing import CharTokenizer, RandomModel, tiny_model

from .conftest import TOOLS, make_engine

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is the weather"}]


def test_unpin_takes_the_messages_chat_pinned(tiny_dir: Path) -> None:
    with make_engine(tiny_dir, capacity_blocks=1024) as engine:  # the tools render to about 1,000 tokens
        _pin_and_unpin(engine)


def _pin_and_unpin(engine: Engine) -> None:
    r = engine.chat(MESSAGES, 1, pin=True, tools=TOOLS, tool_choice="none")
    assert r.pinned_tokens > 0 and engine.stats.pinned_blocks > 0
    assert engine.unpin(MESSAGES) == 0, "rendered without the tools: another prompt, whose pin there is none"
    assert engine.unpin(MESSAGES, tools=TOOLS) == 1
    assert engine.stats.pinned_blocks == 0 and engine.check()["locked_blocks"] == 0


def test_unpin_of_messages_uses_the_namespace_and_options_given() -> None:
    m = tiny_model()
    model = RandomModel(m.config, m.weights, CharTokenizer(m.config.vocab_size))
    with Engine(model, capacity_blocks=256, page_size=4) as engine:
        opts = RequestOptions.of(1, namespace="t", pin=True)
        assert engine.chat(MESSAGES, options=opts).pinned_tokens > 0
        assert engine.chat(MESSAGES, 1, pin=True).pinned_tokens > 0
        assert engine.unpin(MESSAGES, options=opts) == 1
        assert engine.unpin(MESSAGES) == 1 and engine.stats.pinned_blocks == 0
        same = {"max_new_tokens": 2, "pin": True, "temperature": 0.0}  # chat's keywords, passed again as they were
        assert engine.chat(MESSAGES, **same).pinned_tokens > 0
        assert engine.unpin(MESSAGES, **same) == 1 and engine.stats.pinned_blocks == 0
        with pytest.raises(TypeError, match=r"Engine\.unpin"):
            engine.unpin(MESSAGES, tool=TOOLS)
        with pytest.raises(ValueError, match="namespace must be hashable"):
            engine.unpin(MESSAGES, namespace=["t"])
        assert engine.check()["locked_blocks"] == 0
