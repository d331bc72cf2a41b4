"""How a constrained output ends: finish_reason "stop" only for a whole sentence of the grammar, checked with
json.loads / jsonschema / re.fullmatch, not with the grammar itself.

- EOS is masked until the grammar accepts (a +100 bias on it cannot end an unfinished JSON value: the cut at
  max_new_tokens says "length"), and allowed once it does (the same bias ends a number after its first digit).
- A stop string inside the sentence (a key of the JSON object) was honoured: the text was cut mid-object and
  finish_reason said "stop". It now ends the output only where it starts at a point the output was complete.
- A request's own stop token that the grammar took as text ended the output mid-sentence with "stop"; it is now a
  stop token like EOS, and a conflict (the grammar's next text is that token alone) fails with a GrammarError.
"""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest

from radixcache.runtime import Engine
from radixcache.runtime.grammar import GrammarError, GrammarSpec
from tests.runtime.structured.conftest import SCHEMAS, response_format

EOS = 256  # the tiny checkpoint's <|im_end|>


def _json_or_none(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def test_eos_is_masked_until_the_value_is_complete(engine: Engine) -> None:
    rf = response_format("flags")
    for n in (1, 5, 12):
        r = engine.generate("x", n, response_format=rf, logit_bias={EOS: 100.0}, seed=n)
        assert r.finish_reason == "length" and EOS not in r.token_ids, r
        assert _json_or_none(r.text) is None, r.text  # cut short, and said so


def test_eos_ends_a_complete_value(engine: Engine) -> None:
    spec = GrammarSpec.json_schema({"type": "integer"})
    for seed in range(3):
        r = engine.generate("x", 20, grammar=spec, logit_bias={EOS: 100.0}, seed=seed, temperature=1.0)
        assert r.finish_reason == "stop" and r.token_ids[-1] == EOS and len(r.token_ids) >= 2, r
        assert isinstance(json.loads(r.text), int), r.text


def test_a_stop_string_inside_a_json_value_does_not_cut_it(engine: Engine) -> None:
    rf = response_format("flags")
    whole = engine.generate("cut", 60, response_format=rf)
    assert '"color"' in whole.text, whole.text
    for stop in (['"color"'], [", "], ["e"], ['"ok": ']):
        r = engine.generate("cut", 60, response_format=rf, stop=stop)
        assert (r.finish_reason, r.text) == ("stop", whole.text), stop
        jsonschema.validate(json.loads(r.text), SCHEMAS["flags"])


@pytest.mark.parametrize(
    ("stop", "text"), [([" c"], "ab"), (["b c"], "ab cd"), (["ab"], "ab cd"), (["b"], "ab cd"), (["zz", " cd"], "ab")]
)
def test_a_stop_string_cuts_only_where_the_output_was_complete(engine: Engine, stop: list[str], text: str) -> None:
    # EOS biased away: after "ab" (complete) the model must write " cd". A stop string starting at 2 leaves "ab", a
    # sentence of the grammar; one starting at 0 or 1 would leave "" or "a", which are not.
    r = engine.generate("x", 20, grammar=GrammarSpec.regex("ab( cd)?"), logit_bias={EOS: -100.0}, stop=stop)
    assert (r.finish_reason, r.text) == ("stop", text)
    assert re.fullmatch("ab( cd)?", r.text)


def test_a_streamed_output_adds_up_to_the_result_under_a_stop_string(engine: Engine) -> None:
    async def run(stop: list[str]) -> tuple[str, str]:
        stream = engine.stream("x", 20, grammar=GrammarSpec.regex("ab( cd)?"), logit_bias={EOS: -100.0}, stop=stop)
        text = "".join([d async for d in stream])
        assert stream.result is not None
        return text, stream.result.text

    for stop, want in (([" c"], "ab"), (["b"], "ab cd")):
        assert asyncio.run(run(stop)) == (want, want)


def test_a_stop_token_ends_a_grammar_only_where_it_is_complete(engine: Engine) -> None:
    rf = response_format("flags")
    whole = engine.generate("cut", 60, response_format=rf)
    ended, refused = 0, 0
    for token in sorted(set(whole.token_ids[:-1])):
        try:
            r = engine.generate("cut", 60, response_format=rf, stop_token_ids=[token])
        except GrammarError as exc:  # the grammar's next text was that token alone
            assert exc.path == "stop_token_ids" and f"token {token} " in str(exc), exc
            refused += 1
            continue
        assert r.finish_reason == "stop", r
        jsonschema.validate(json.loads(r.text), SCHEMAS["flags"])
        ended += 1
    assert ended and refused  # both kinds occur in this output
    assert engine.check()["locked_blocks"] == 0


def test_a_stop_token_after_a_complete_output_ends_it_unshown(engine: Engine) -> None:
    digits = [engine.tokenizer.encode(str(d), add_special_tokens=False)[0] for d in range(10)]
    for seed in range(4):
        r = engine.generate("n", 30, grammar=GrammarSpec.regex("[0-9]+"), stop_token_ids=digits[5:], seed=seed)
        assert re.fullmatch("[0-4]+", r.text), r.text  # the stop digits never written as text: they end it
        if r.finish_reason == "stop" and r.token_ids[-1] != EOS:
            assert r.token_ids[-1] in digits[5:] and len(r.token_ids) >= 2


def test_a_stop_token_the_grammar_names_mid_sentence_is_its_text(engine: Engine) -> None:
    r = engine.generate("Say", 8, grammar=GrammarSpec.ebnf('start: "a" <|im_end|> "b"'), seed=1)
    assert r.finish_reason == "stop" and r.token_ids[1] == EOS and r.text == "ab", r
