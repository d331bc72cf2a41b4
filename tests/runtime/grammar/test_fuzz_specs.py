"""Fuzzing the specs: any JSON value as a schema (built from schema keywords and random values), any text as a
regex or grammar, any object as a response_format either compiles or raises GrammarError (a 400), never another
exception (a 500); a schema that compiles yields a state whose first mask allows something."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixcache.runtime.grammar import GrammarError, GrammarSpec, GrammarState, allocate_masks

KEYWORDS = [
    "type", "properties", "items", "required", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
    "additionalProperties", "pattern", "minLength", "maxLength", "minimum", "maximum", "minItems", "maxItems",
    "format", "uniqueItems", "prefixItems", "not",
]  # fmt: skip
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 20), st.floats(allow_nan=False, allow_infinity=False, width=16),
    st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null", "nope", "#/$defs/a",
                     "#/properties", "[a-z]+", "(", "email", "date-time", "a", "b"]),
)  # fmt: skip
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from([*KEYWORDS, "a", "b"]), inner, max_size=4),
    ),
    max_leaves=12,
)
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def compiles_or_grammar_error(compiler, build) -> object | None:
    try:
        return compiler.compile(build())
    except GrammarError:
        return None


@FUZZ
@given(schema=JSONISH, strict=st.booleans())
def test_any_schema_compiles_or_raises_grammar_error(tiny_compiler, schema: object, strict: bool) -> None:
    body = {"type": "json_schema", "json_schema": {"name": "f", "schema": schema, "strict": strict}}
    compiled = compiles_or_grammar_error(tiny_compiler, lambda: GrammarSpec.from_response_format(body))
    if compiled is not None:
        try:
            state = GrammarState(compiled)
        except GrammarError:
            return
        row = allocate_masks(1, compiled.vocab.vocab_size)
        state.allowed_mask(row[0])
        assert np.any(row) or state.is_complete(), json.dumps(schema)


@FUZZ
@given(text=st.text(alphabet=st.sampled_from(list('ab()[]{}*+?|^$\\.-:=" \n0:root')), max_size=24))
def test_any_regex_or_grammar_text_compiles_or_raises_grammar_error(tiny_compiler, text: str) -> None:
    compiles_or_grammar_error(tiny_compiler, lambda: GrammarSpec.regex(text))
    compiles_or_grammar_error(tiny_compiler, lambda: GrammarSpec.ebnf(text))
    compiles_or_grammar_error(tiny_compiler, lambda: GrammarSpec.ebnf("root ::= " + text))


@FUZZ
@given(body=JSONISH)
def test_any_response_format_is_a_spec_none_or_grammar_error(body: object) -> None:
    try:
        GrammarSpec.from_response_format(body)
        GrammarSpec.from_response_format({"type": "json_schema", "json_schema": body})
    except GrammarError:
        pass


@pytest.mark.parametrize(
    ("schema", "where", "says"),
    [
        ({"type": "object", 1: "x"}, "", "key must be a string, not int 1"),
        ({"enum": [{"a": 1, 2: 3}]}, ".enum[0]", "key must be a string"),
        ({"const": b"x"}, ".const", "not a JSON value: bytes"),
        ({"type": "array", "default": {1, 2}}, ".default", "not a JSON value: set"),
    ],
)
def test_python_values_that_are_no_json_are_grammar_errors(schema: dict, where: str, says: str) -> None:
    """The Python API takes a schema as a dict: a key that is no string or a value that is no JSON failed with a
    TypeError from the canonical form's sort or json.dumps, where every other bad schema is a GrammarError."""
    with pytest.raises(GrammarError, match=says) as info:
        GrammarSpec.json_schema(schema, path="schema")
    assert info.value.path == f"schema{where}"
