"""Hostile calls to every entry of the engine's Python API (generate, chat, submit, submit_group, fork, stream), drawn
by hypothesis: hostile prompts (empty, negative or out-of-vocabulary ids, wrong types, nested lists), hostile chat
messages (unknown roles, missing or non-string content, wrong shapes) and hostile keyword values, sent while a
greedy bystander decodes. Each call is refused at once with a ValueError or TypeError whose message says what was
wrong, or runs (finishing, or failing alone with SamplingError); never another exception. The bystander's output
always equals its output alone, and afterwards the cache's invariants hold and no block is held."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcache.runtime import Engine
from radixcache.runtime.engine.errors import SamplingError
from tests.runtime.faults.conftest import assert_clean, ids
from tests.runtime.faults.test_hostile_fuzz import ANY_VALUE, KWARGS

BYSTANDER = 24
TOKEN = st.one_of(
    st.integers(1, 96), st.integers(-(2**40), 2**40), st.booleans(), st.floats(), st.none(), st.text(max_size=2)
)
PROMPT = st.one_of(
    st.text(max_size=40),
    st.lists(st.integers(1, 96), max_size=30),
    st.lists(TOKEN, max_size=8),
    st.lists(st.lists(st.integers(-3, 120), max_size=4), max_size=3),
    ANY_VALUE,
    st.dictionaries(st.text(max_size=3), ANY_VALUE, max_size=2),
)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]), "content": st.text(max_size=20)}),
    st.dictionaries(st.sampled_from(["role", "content", "name", "tool_calls", "x"]), ANY_VALUE, max_size=3),
    ANY_VALUE,
)
MESSAGES = st.one_of(st.lists(MESSAGE, max_size=4), ANY_VALUE)
ENTRIES = ("generate", "chat", "submit", "submit_group", "fork", "stream")
# What a refusal's message must name: the thing that was wrong (a field, the prompt, the messages, a keyword).
WORDS = ("prompt", "token", "message", "role", "content", "max_new_tokens", "keyword", "argument", "n ", "fork")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, list[int], tuple[int, ...]]]:
    """The tiny checkpoint with its real (byte-level) tokenizer and chat template: chat messages are checked as
    served models' are."""
    path = Path(__file__).resolve().parents[2] / "cli" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_cli_conftest", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    model = str(module.write_tiny_checkpoint(tmp_path_factory.mktemp("models") / "tiny"))
    prompt = ids(20, 41)
    with Engine(model, capacity_blocks=64, page_size=16, dtype="float64") as ref:
        alone = ref.generate(prompt, BYSTANDER, ignore_eos=True).token_ids
    with Engine(model, capacity_blocks=64, page_size=16, dtype="float64") as engine:
        yield engine, prompt, alone


def _call(engine: Engine, entry: str, prompt: Any, messages: Any, max_new: Any, kwargs: dict[str, Any]) -> None:
    """One hostile call; a result is waited for (results are checked by what they may not do: fail others)."""
    if entry == "generate":
        engine.generate(prompt, max_new, **kwargs)
    elif entry == "chat":
        engine.chat(messages, max_new, **kwargs)
    elif entry == "submit":
        handles = engine.submit(prompt, max_new, **kwargs)
        for h in handles if isinstance(handles, list) else [handles]:
            h.result(60)
    elif entry == "submit_group":
        for h in engine.submit_group([prompt, prompt], max_new, **kwargs):
            h.result(60)
    elif entry == "fork":
        engine.fork(messages if isinstance(messages, list) and messages else prompt, 2, max_new, **kwargs)
    else:

        async def consume() -> None:
            async for _ in engine.stream(prompt, max_new, **kwargs):
                pass

        asyncio.run(consume())


@pytest.mark.slow  # 30 examples: about 5 s idle, 30 s on a busy 2-core machine
@settings(max_examples=30, deadline=None)
@given(
    entry=st.sampled_from(ENTRIES),
    prompt=PROMPT,
    messages=MESSAGES,
    kwargs=KWARGS,
    max_new=st.one_of(st.integers(-2, 6), ANY_VALUE),
)
def test_hostile_api_calls_fail_alone_with_a_clear_error(
    setup: tuple[Engine, list[int], tuple[int, ...]],
    entry: str,
    prompt: Any,
    messages: Any,
    max_new: Any,
    kwargs: dict[str, Any],
) -> None:
    engine, bystander_prompt, alone = setup
    if isinstance(max_new, int) and not isinstance(max_new, bool) and max_new > 6:
        max_new = 6  # a valid but long request only costs time
    if "timeout" in kwargs and isinstance(kwargs["timeout"], (int, float)) and not isinstance(kwargs["timeout"], bool):
        kwargs["timeout"] = None if kwargs["timeout"] < 5 else kwargs["timeout"]  # a short timeout is a valid ending
    mine = engine.submit(bystander_prompt, BYSTANDER, ignore_eos=True)  # decoding while the hostile call arrives
    try:
        with contextlib.suppress(SamplingError):  # it ran and failed alone
            _call(engine, entry, prompt, messages, max_new, kwargs)
    except (ValueError, TypeError) as exc:  # refused: the message names what was wrong
        text = str(exc).lower()
        assert text and any(w in text for w in (*WORDS, *(k.lower() for k in kwargs))), repr(exc)
    assert mine.result(60).token_ids == alone
    assert_clean(engine)
