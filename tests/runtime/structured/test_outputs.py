"""Constrained outputs of the engine (tiny checkpoint, random weights: the model alone never writes JSON):
json_schema outputs validate (jsonschema) for many seeds and temperatures, with top-k/top-p/min-p; json_object
gives an object; a regex output fullmatches; GBNF and Lark grammars give sentences; every request ends by itself
(the grammar finishing), never by length; an unconstrained run of the same prompt is not JSON, so the grammar did
the work."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest

from radixcache.runtime import Engine
from radixcache.runtime.grammar import GrammarError, GrammarSpec
from tests.runtime.structured.conftest import SCHEMAS, response_format

TEMPERATURES = (0.0, 0.7, 1.0, 1.6)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_outputs_validate_for_many_seeds_and_temperatures(engine: Engine, name: str) -> None:
    rf = response_format(name)
    handles = [
        engine.submit(f"item {seed}:", 160, response_format=rf, temperature=t, seed=seed)
        for t in TEMPERATURES
        for seed in range(5)
    ]
    for h in handles:
        r = h.result(120)
        assert r.finish_reason == "stop", (r.finish_reason, r.text)
        jsonschema.validate(json.loads(r.text), SCHEMAS[name])


def test_sampling_filters_compose_with_the_mask(engine: Engine) -> None:
    rf = response_format("nested")
    for kw in ({"top_k": 3}, {"top_p": 0.5}, {"min_p": 0.2}, {"top_k": 50, "top_p": 0.9, "min_p": 0.05}):
        for seed in range(3):
            r = engine.generate("x", 160, response_format=rf, temperature=1.2, seed=seed, **kw)
            jsonschema.validate(json.loads(r.text), SCHEMAS["nested"])


def test_json_object_gives_an_object(engine: Engine) -> None:
    # Any object: the random model may open strings it never closes, so this one is given a length and the outputs
    # that ended are checked (most do; json_object has no bound on its sentences).
    results = [
        engine.generate("obj", 120, response_format={"type": "json_object"}, seed=s, temperature=0.8) for s in range(6)
    ]
    ended = [r for r in results if r.finish_reason == "stop"]
    assert ended, [r.text for r in results]
    for r in ended:
        assert isinstance(json.loads(r.text), dict)


def test_unconstrained_output_of_the_same_request_is_not_json(engine: Engine) -> None:
    text = engine.generate("item 0:", 40, ignore_eos=True).text
    with pytest.raises(ValueError):
        json.loads(text)


@pytest.mark.parametrize(
    "pattern", [r"[0-9]{3}-[a-z]{2,4}", r"(yes|no|maybe)!?", r"[A-Z][a-z]{0,6}\.", r"\d{1,3}(\.\d\d)?"]
)
def test_regex_outputs_fullmatch(engine: Engine, pattern: str) -> None:
    for seed in range(4):
        r = engine.generate("say:", 40, grammar=GrammarSpec.regex(pattern), temperature=1.0, seed=seed)
        assert r.finish_reason == "stop", r.text
        assert re.fullmatch(pattern, r.text), r.text


@pytest.mark.parametrize(
    "grammar",
    [
        'root ::= answer "."\nanswer ::= "yes" | "no" | "n=" [0-9] [0-9]?',  # GBNF (llama.cpp)
        'start: answer "."\nanswer: "yes" | "no" | "n=" /[0-9]{1,2}/',  # Lark
    ],
)
def test_ebnf_outputs_are_sentences(engine: Engine, grammar: str) -> None:
    for seed in range(4):
        r = engine.generate("q?", 20, grammar=GrammarSpec.ebnf(grammar), temperature=1.0, seed=seed)
        assert r.finish_reason == "stop"
        assert re.fullmatch(r"(yes|no|n=[0-9]{1,2})\.", r.text), r.text


def test_a_grammar_that_may_go_on_ends_only_when_complete(engine: Engine) -> None:
    # `[0-9]+` may always take another digit: the request ends by EOS once the grammar allows it (never before), or
    # at its length with digits only.
    for seed in range(4):
        r = engine.generate("n:", 12, grammar=GrammarSpec.regex("[0-9]+"), temperature=1.0, seed=seed)
        assert re.fullmatch("[0-9]+", r.text), r.text
        if r.finish_reason == "stop":
            assert r.token_ids[-1] in engine.eos_token_ids
        else:
            assert r.finish_reason == "length" and len(r.token_ids) == 12


def test_ignore_eos_still_ends_when_the_grammar_does(engine: Engine) -> None:
    r = engine.generate("a", 50, grammar=GrammarSpec.regex("(ab|cd)"), ignore_eos=True, temperature=1.0, seed=1)
    assert r.text in ("ab", "cd") and r.finish_reason == "stop"


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("[^\\x00-\\U0010FFFF]", "no text the model can write satisfies the grammar"),
        ("a{1000000}", "expands to more than 10,000 parts"),  # refused by its size now, before the library sees it
    ],
)
def test_a_grammar_the_matcher_fails_on_says_why_in_one_line(engine: Engine, pattern: str, says: str) -> None:
    """A regex no text matches failed with llguidance's "NoExtensionBias" and a dump of its parser state; one past
    its lexer's limits with "token N is not allowed here", as if the model had broken the mask (such a regex is
    refused by its size now, before the library compiles it: runtime/grammar/regex_size.py). The request fails
    alone, with the matcher's reason and nothing of its dump; the engine goes on."""
    with pytest.raises(GrammarError) as info:
        engine.generate("Say a", 4, grammar=GrammarSpec.regex(pattern), seed=1)
    message = str(info.value)
    assert says in message and "<state>" not in message and "\n" not in message, message
    assert engine.generate("Say a", 3, seed=1, ignore_eos=True).token_ids
    assert engine.check()["locked_blocks"] == 0


@pytest.mark.parametrize("nested", [False, True])
def test_an_object_of_too_many_optional_properties_fails_in_a_schemas_terms(engine: Engine, nested: bool) -> None:
    """llguidance's parser follows at most 2,000 items in one row, about 4 per optional property: an object of 500
    open to other keys compiles, and fails once the output enters it with "Current row has ... items; max is 2000;
    consider making your grammar left-recursive", advice for grammar writers. The request fails alone, saying what
    to change. One of more than 500 is refused before it is compiled (tests/runtime/grammar/test_schema_size.py)."""
    big = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(500)}}
    schema = {"type": "object", "properties": {"a": big}, "required": ["a"]} if nested else big
    with pytest.raises(GrammarError, match="optional properties") as info:
        engine.generate("Say a", 8, grammar=GrammarSpec.json_schema(schema, strict=False), seed=1)
    assert "left-recursive" not in str(info.value)
    assert engine.generate("Say a", 3, seed=1, ignore_eos=True).token_ids
    assert engine.check()["locked_blocks"] == 0


@pytest.mark.parametrize("grammar", ['start: "ab" <|im_end|>', 'start: "ab" <[256]>', "start: <|im_end|>"])
def test_a_grammar_that_names_the_stop_token_ends_on_it(engine: Engine, grammar: str) -> None:
    """A Lark grammar may name a special token, the model's EOS (<|im_end|>, id 256) included. The mask cleared
    every stop token while the grammar was incomplete, the very token the grammar asks for among them: nothing was
    allowed and the request failed with a SamplingError ("the logits went non-finite"). The grammar's own stop token
    is allowed where it names it, taken through the matcher, and ends the request like any stop token."""
    eos = engine.eos_token_ids[0]
    for temperature in (0.0, 1.0):
        r = engine.generate("Say", 8, grammar=GrammarSpec.ebnf(grammar), temperature=temperature, seed=1)
        assert r.finish_reason == "stop" and r.token_ids[-1] == eos, r
        assert r.text == ("" if grammar == "start: <|im_end|>" else "ab")
    assert engine.check()["locked_blocks"] == 0


def test_grammar_and_response_format_together(engine: Engine) -> None:
    """Both keywords set the one output constraint, and the later one replaced the earlier: `grammar=` beside a
    `response_format=None` (a wrapper's default) ran unconstrained, and two real constraints kept whichever came
    last. "No constraint" (None, `{"type": "text"}`) no longer undoes `grammar=`; two constraints are a ValueError,
    as the server's 400 for two of response_format, regex and grammar."""
    ab = GrammarSpec.regex("ab")
    for none in (None, {"type": "text"}):
        assert engine.generate("x", 8, grammar=ab, response_format=none).text == "ab"
        assert engine.generate("x", 8, response_format=none, grammar=ab).text == "ab"
    both = [{"grammar": ab, "response_format": {"type": "json_object"}}]
    both.append(dict(reversed(both[0].items())))
    for kwargs in both:
        with pytest.raises(ValueError, match="at most one of grammar and response_format"):
            engine.generate("x", 8, **kwargs)
    assert engine.check()["locked_blocks"] == 0


def test_a_grammar_that_gives_up_past_the_compiles_probe_fails_its_request_alone_saying_why(engine: Engine) -> None:
    """The compile takes a few tokens (runtime/grammar/compiler.py, PROBE_TOKENS); a grammar whose parser gives up
    past them (here behind 8 free tokens) compiles, and its request fails where it gives up: a GrammarError naming
    the spec's path in the words of the compile's refusal, whole or streamed, never a crash or a hang; a request
    beside it is served, and nothing stays locked."""
    spec = GrammarSpec.ebnf('start: ("x" | "y"){8} ("a"+){1000}', path="grammar")
    says = r"^grammar: the grammar's parser gives up: .*Too many items.*ambiguous repetitions"
    bystander = engine.submit("Say a", 6, seed=1, ignore_eos=True)
    with pytest.raises(GrammarError, match=says) as info:
        engine.generate("Say a", 40, grammar=spec, seed=1)
    assert info.value.path == "grammar"
    assert len(bystander.result(timeout=60).token_ids) == 6

    async def streamed() -> str:
        text = ""
        async for delta in engine.stream("Say a", 40, grammar=spec, seed=1):
            text += delta
        return text

    with pytest.raises(GrammarError, match=says):
        asyncio.run(streamed())
    assert engine.check()["locked_blocks"] == 0
