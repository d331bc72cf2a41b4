"""A schema too large to compile is refused before the library sees it, naming the part that holds its bulk: an enum
of 100,000 strings took ~20 s of a worker thread before llguidance refused it, 10,000 required properties compiled
in ~15 s, and such grammars (past what the compiler's cache keeps) were compiled again for every request. Just
under the bound a schema still compiles and its walks validate. So does an object of more than 500 optional
properties, which compiled in seconds (3,000: 14 s) and then failed once the output entered it."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from radixcache.runtime.grammar import GrammarCompiler, GrammarError, GrammarSpec, GrammarState
from radixcache.runtime.grammar.schema_size import MAX_SCHEMA_CHARS
from tests.runtime.grammar.conftest import token_table, walk

ROOT = "response_format.json_schema.schema"


def _enum(n: int) -> list[str]:
    return [f"value number {i}" for i in range(n)]


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "object", "properties": {"a": {"enum": _enum(100_000)}}, "required": ["a"]}, ".properties.a.enum"),
        ({"enum": _enum(100_000)}, ".enum"),
        ({"properties": {f"p{i}": {"type": "integer"} for i in range(10_000)}, "required": ["p0"]}, ".properties"),
        ({"type": "object", "properties": {"a": {"const": "x" * 1_000_000}}}, ".properties.a"),
        ({"anyOf": [{"type": "string"}, {"items": [{"const": "y" * 300_000}]}]}, ".anyOf[1].items[0]"),
        ({"$defs": {"big": {"enum": _enum(30_000)}}, "$ref": "#/$defs/big"}, ".$defs.big.enum"),
    ],
)
def test_a_schema_too_large_is_refused_naming_its_bulk(schema: Any, path: str) -> None:
    for given in (schema, json.dumps(schema)):
        with pytest.raises(GrammarError) as info:
            GrammarSpec.json_schema(given, path=ROOT)
        assert info.value.path == ROOT + path, info.value
        assert f"at most {MAX_SCHEMA_CHARS:,}" in str(info.value)


def test_a_response_format_too_large_is_refused_by_its_path() -> None:
    body = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": _enum(100_000)}, "strict": True}}
    with pytest.raises(GrammarError) as info:
        GrammarSpec.from_response_format(body)
    assert info.value.path == f"{ROOT}.enum"


def test_a_schema_under_the_bound_compiles_and_validates(tiny_tokenizer: Any, tiny_compiler: GrammarCompiler) -> None:
    schema = {"type": "object", "properties": {"a": {"enum": _enum(5_000)}}, "required": ["a"]}
    assert len(json.dumps(schema)) < MAX_SCHEMA_CHARS
    compiled = tiny_compiler.compile(GrammarSpec.json_schema(schema))
    table = token_table(tiny_tokenizer, tiny_compiler.vocab)
    for seed in range(3):
        text = tiny_tokenizer.decode(walk(GrammarState(compiled), table, seed))
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "object", "properties": {f"p{i}": {} for i in range(3_000)}}, ".properties"),
        ({"properties": {f"p{i}": {} for i in range(600)}, "required": ["p0", "p1", "nope"]}, ".properties"),
        ({"anyOf": [{"type": "null"}, {"properties": {"a": {"properties": {f"p{i}": {} for i in range(501)}}}}]},
         ".anyOf[1].properties.a.properties"),
    ],
)  # fmt: skip
def test_an_object_of_over_500_optional_properties_is_refused_before_compiling(schema: Any, path: str) -> None:
    for strict in (True, False):
        with pytest.raises(GrammarError, match="optional properties in one object") as info:
            GrammarSpec.json_schema(schema, strict=strict, path=ROOT)
        assert info.value.path == ROOT + path


def test_500_optional_properties_still_compile(tiny_tokenizer: Any, tiny_compiler: GrammarCompiler) -> None:
    props = {f"p{i}": {"type": "integer", "minimum": 0, "maximum": 9} for i in range(520)}
    schema = {"type": "object", "properties": props, "required": [f"p{i}" for i in range(20)]}
    compiled = tiny_compiler.compile(GrammarSpec.json_schema(schema))
    text = tiny_tokenizer.decode(walk(GrammarState(compiled), token_table(tiny_tokenizer, tiny_compiler.vocab), 0))
    jsonschema.validate(json.loads(text), schema)
