"""Decoding under the grammar mask with the tiny checkpoint's byte-level tokenizer: random walks (random logits,
argmax under the mask) always give text that parses and validates (jsonschema) for several schemas; json_object
gives a JSON object; regex output fullmatches; an EBNF grammar's output is one of its sentences; once the grammar is
complete only the stop tokens are allowed, and a stop token earlier is refused."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest

from radixcache.runtime.grammar import GrammarError, GrammarSpec, GrammarState, allocate_masks
from radixcache.runtime.grammar.masks import unpack_masks
from tests.runtime.grammar.conftest import token_table, walk
from tests.runtime.grammar.schemas import ALL


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("strict", [True, False])
def test_random_walks_under_a_schema_validate(tiny_tokenizer, tiny_compiler, name: str, strict: bool) -> None:
    schema = ALL[name]
    compiled = tiny_compiler.compile(GrammarSpec.json_schema(schema, strict=strict))
    table = token_table(tiny_tokenizer, compiled.vocab)
    for seed in range(3):
        text = decode(tiny_tokenizer, walk(GrammarState(compiled), table, seed))
        jsonschema.validate(json.loads(text), schema)


def test_json_object_walks_give_objects(tiny_tokenizer, tiny_compiler) -> None:
    compiled = tiny_compiler.compile(GrammarSpec.json_object())
    table = token_table(tiny_tokenizer, compiled.vocab)
    for seed in range(4):
        assert isinstance(json.loads(decode(tiny_tokenizer, walk(GrammarState(compiled), table, seed))), dict)


def test_any_whitespace_walks_still_validate(tiny_tokenizer, tiny_compiler) -> None:
    schema = ALL["nested"]
    compiled = tiny_compiler.compile(GrammarSpec.json_schema(schema, any_whitespace=True))
    table = token_table(tiny_tokenizer, compiled.vocab)
    for seed in range(2):
        jsonschema.validate(json.loads(decode(tiny_tokenizer, walk(GrammarState(compiled), table, seed))), schema)


@pytest.mark.parametrize("pattern", [r"[0-9]{3}-[a-z]{2,4}", r"(yes|no|maybe)!?", r"\d+(\.\d+)?", r'"[^"\\]{0,5}"'])
def test_regex_walks_fullmatch(tiny_tokenizer, tiny_compiler, pattern: str) -> None:
    compiled = tiny_compiler.compile(GrammarSpec.regex(pattern))
    table = token_table(tiny_tokenizer, compiled.vocab)
    for seed in range(4):
        text = decode(tiny_tokenizer, walk(GrammarState(compiled), table, seed, close_after=6))
        assert re.fullmatch(pattern, text), text


@pytest.mark.parametrize(
    "grammar",
    ['root ::= answer "."\nanswer ::= "yes" | "no" | "n=" [0-9] [0-9]?', 'start: answer "."\nanswer: "yes" | "no"'],
)
def test_ebnf_walks_give_sentences(tiny_tokenizer, tiny_compiler, grammar: str) -> None:
    compiled = tiny_compiler.compile(GrammarSpec.ebnf(grammar))
    table = token_table(tiny_tokenizer, compiled.vocab)
    for seed in range(4):
        text = decode(tiny_tokenizer, walk(GrammarState(compiled), table, seed, close_after=4))
        assert re.fullmatch(r"(yes|no|n=[0-9]{1,2})\.", text), text


def allowed_ids(state: GrammarState) -> set[int]:
    row = allocate_masks(1, state.vocab.vocab_size)
    state.allowed_mask(row[0])
    return set(np.flatnonzero(unpack_masks(row, state.vocab.vocab_size)[0].numpy()).tolist())


def test_only_stop_tokens_once_the_grammar_is_complete(tiny_tokenizer, tiny_compiler) -> None:
    state = GrammarState(tiny_compiler.compile(GrammarSpec.regex("ab")))
    eos = tiny_tokenizer.eos_token_ids[0]
    a, b = tiny_tokenizer.encode("a", add_special_tokens=False)[0], tiny_tokenizer.encode("b")[0]
    assert allowed_ids(state) == {a}
    with pytest.raises(GrammarError):
        state.accept(eos)  # not complete yet
    state.accept(a)
    state.accept(b)
    assert allowed_ids(state) == {eos}
    state.accept(eos)
    assert state.is_terminated() and allowed_ids(state) == set()


def test_stop_tokens_allowed_beside_continuations_when_complete(tiny_tokenizer, tiny_compiler) -> None:
    state = GrammarState(tiny_compiler.compile(GrammarSpec.regex(r"[0-9]+")))
    eos = tiny_tokenizer.eos_token_ids[0]
    digits = {tiny_tokenizer.encode(str(d), add_special_tokens=False)[0] for d in range(10)}
    assert allowed_ids(state) == digits
    state.accept(min(digits))
    assert allowed_ids(state) == digits | {eos}
    assert 258 not in allowed_ids(state) and 259 not in allowed_ids(state)  # past the tokenizer's vocabulary


def test_rollback_returns_to_an_earlier_mask(tiny_tokenizer, tiny_compiler) -> None:
    state = GrammarState(tiny_compiler.compile(GrammarSpec.regex(r"(ab|ac)d")))
    ids = {ch: tiny_tokenizer.encode(ch, add_special_tokens=False)[0] for ch in "abcd"}
    state.accept(ids["a"])
    after_a = allowed_ids(state)
    state.accept(ids["b"])
    state.rollback(1)
    assert allowed_ids(state) == after_a == {ids["b"], ids["c"]}
    for ch in "cd":
        state.accept(ids[ch])
    state.accept(tiny_tokenizer.eos_token_ids[0])
    state.rollback(2)
    assert not state.is_terminated() and allowed_ids(state) == {ids["d"]}


@pytest.mark.parametrize("strict", [True, False])
def test_strict_closes_objects_without_additional_properties(tiny_tokenizer, tiny_compiler, strict: bool) -> None:
    state = GrammarState(tiny_compiler.compile(GrammarSpec.json_schema(ALL["person"], strict=strict)))
    for t in tiny_tokenizer.encode('{"name": "x", "age": 1, ', add_special_tokens=False):
        state.accept(t)
    z = tiny_tokenizer.encode('"z', add_special_tokens=False)
    state.accept(z[0])
    if strict:
        with pytest.raises(GrammarError):
            state.accept(z[1])
    else:
        state.accept(z[1])


_ID = {"type": "object", "properties": {"id": {"type": "integer", "maximum": 9}}, "required": ["id"]}
_TAG = {"type": "object", "properties": {"tag": {"enum": ["x", "y"]}}, "required": ["tag"]}
MERGED = {  # schemas whose object keys are given by several subschemas that merge into one object
    "allOf": {"allOf": [_ID, _TAG]},
    "allOf beside properties": {**_TAG, "allOf": [_ID]},
    "allOf of a $ref": {"$defs": {"Base": _ID}, "allOf": [{"$ref": "#/$defs/Base"}, _TAG]},
    "$ref beside properties": {"$defs": {"Base": _ID}, "$ref": "#/$defs/Base", **_TAG},
    "anyOf beside properties": {**_TAG, "anyOf": [_ID, {"properties": {"n": {"type": "null"}}, "required": ["n"]}]},
}


@pytest.mark.parametrize("name", sorted(MERGED))
def test_strict_keeps_the_keys_that_merged_subschemas_name(tiny_tokenizer, tiny_compiler, name: str) -> None:
    """Strict mode closed every subschema with `properties` on its own, so the keys one member of an allOf (or the
    schema beside it) requires were refused by the others' `additionalProperties: false`: a valid schema was an
    "Unsatisfiable schema" error. The merged object admits the keys of all of them, and still no other key."""
    schema = MERGED[name]
    compiled = tiny_compiler.compile(GrammarSpec.json_schema(schema, strict=True))
    table = token_table(tiny_tokenizer, compiled.vocab)
    for seed in range(3):
        value = json.loads(decode(tiny_tokenizer, walk(GrammarState(compiled), table, seed)))
        jsonschema.validate(value, schema)
        assert "tag" in value and set(value) <= {"id", "tag", "n"}, value
    state = GrammarState(compiled)
    for t in tiny_tokenizer.encode('{"', add_special_tokens=False):
        state.accept(t)
    firsts = {decode(tiny_tokenizer, [t])[:1] for t in allowed_ids(state)}
    assert firsts and firsts <= {"i", "t", "n"}, firsts  # the first key: one the subschemas name, never another


@pytest.mark.parametrize("strict", [True, False])
def test_the_schema_true_admits_any_json_value_and_false_none(tiny_tokenizer, tiny_compiler, strict: bool) -> None:
    """A boolean is a whole JSON schema (`true`: any value; `false`: none) and `json_schema` takes one, but the
    library takes only objects: `true` failed with its "Expecting object schema to apply options"."""
    spec = GrammarSpec.from_response_format(
        {"type": "json_schema", "json_schema": {"name": "any", "schema": True, "strict": strict}}
    )
    compiled = tiny_compiler.compile(spec)
    table = token_table(tiny_tokenizer, compiled.vocab)
    for seed in range(4):
        json.loads(decode(tiny_tokenizer, walk(GrammarState(compiled), table, seed)))
    firsts = {decode(tiny_tokenizer, [t])[:1] for t in allowed_ids(GrammarState(compiled))}
    assert {"{", "[", '"', "t", "n", "1"} <= firsts, firsts  # an object, an array, a string, a literal, a number
    with pytest.raises(GrammarError, match="the schema false admits no value") as info:
        tiny_compiler.compile(GrammarSpec.json_schema(False, strict=strict))
    assert info.value.path == "response_format.json_schema.schema"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (GrammarSpec.json_schema({"const": "<|im_end|>"}), '"<|im_end|>"'),
        (GrammarSpec.regex(r"<\|im_start\|>user"), "<|im_start|>user"),
        (GrammarSpec.ebnf('start: "say <|im_end|>"'), "say <|im_end|>"),  # quoted: text, not the token
    ],
    ids=["const", "regex", "lark"],
)
def test_forced_text_holding_a_special_tokens_text_is_written_as_text(
    tiny_tokenizer, tiny_compiler, spec: GrammarSpec, expected: str
) -> None:
    """The tokenizer encodes the text `<|im_end|>` as its special token, and the forced text's ids were taken from
    it: the mask allowed that token, which never matches text, and the request failed at its first step."""
    compiled = tiny_compiler.compile(spec)
    out = walk(GrammarState(compiled), token_table(tiny_tokenizer, compiled.vocab), seed=0)
    assert decode(tiny_tokenizer, out) == expected
    assert not set(out) & set(tiny_tokenizer.backend.get_added_tokens_decoder())
