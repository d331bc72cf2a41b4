"""A stop string under a grammar that starts inside a token's text (SmolLM2's tokens are words: " with", " John"):
it ends the output where the text before it is a sentence of the grammar, and only there, as one that starts where
a token does. It was checked only where tokens start, so under `[a-z ]+` (a sentence after every letter) the stop
"ith" of " with" never ended the output: it ran to max_tokens, "length", the stop string in its text. Expected cuts
come from re.fullmatch and json.loads on the whole output, not from the grammar."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from radixcache.runtime import Engine
from radixcache.runtime.grammar import GrammarSpec

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("structured_smollm2")]
PROMPT = "The quick brown fox"
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def engine(smollm2_gguf: Any, smollm2_gguf_model: Any) -> Any:
    # the quant="gguf" model built once per worker (tests/conftest.py)
    with Engine(smollm2_gguf_model, tokenizer=smollm2_gguf.tokenizer, page_size=16) as e:
        yield e
        assert e.check()["locked_blocks"] == 0


def _inner_stops(engine: Engine, token_ids: tuple[int, ...]) -> list[str]:
    """Stop strings that start one character into a token of the output: the token's letters but its first."""
    words = [engine.tokenizer.decode([t]).strip() for t in token_ids]
    return [w[1:] for w in words if len(w) >= 3 and w.isalpha()]


def test_a_stop_string_inside_a_token_cuts_where_the_text_before_it_is_a_sentence(engine: Engine) -> None:
    grammar = GrammarSpec.regex("[a-z ]+")
    whole = engine.generate(PROMPT, 12, grammar=grammar, seed=0)
    stops = _inner_stops(engine, whole.token_ids)
    assert stops, whole
    for stop in stops[:3]:
        at = next(i for i in range(1, len(whole.text)) if whole.text.startswith(stop, i))
        assert re.fullmatch("[a-z ]+", whole.text[:at])
        r = engine.generate(PROMPT, 12, grammar=grammar, seed=0, stop=[stop])
        assert (r.finish_reason, r.text) == ("stop", whole.text[:at]), stop
    assert asyncio.run(_streamed(engine, grammar, stops[0])) == (whole.text[: whole.text.index(stops[0], 1)],) * 2


async def _streamed(engine: Engine, grammar: GrammarSpec, stop: str) -> tuple[str, str]:
    stream = engine.stream(PROMPT, 12, grammar=grammar, seed=0, stop=[stop])
    text = "".join([d async for d in stream])
    assert stream.result is not None
    return text, stream.result.text


def test_a_stop_string_inside_a_token_of_a_json_value_is_its_text(engine: Engine) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    prompt = "Give a person as JSON."
    whole = engine.generate(prompt, 40, response_format=rf, temperature=0)
    assert whole.finish_reason == "stop" and json.loads(whole.text), whole
    stops = _inner_stops(engine, whole.token_ids)
    assert stops, whole
    for stop in stops[:3]:
        r = engine.generate(prompt, 40, response_format=rf, temperature=0, stop=[stop])
        assert (r.finish_reason, r.text) == ("stop", whole.text), stop  # a cut there leaves no JSON
