"""A lone surrogate (JSON's `"\\ud800"`, half a UTF-16 pair, which no UTF-8 text holds) in a schema's key or string
is a GrammarError naming where it is, written so the error can be sent (escaped in the path). The library refused
one naming only the schema's root ("Value is not JSON serializable"); one in an optional property's name it took,
a key no output could write; over HTTP the error body naming such a key could not be encoded (the 400 said
"'utf-8' codec can't encode" with no param). Whole pairs (an emoji), NUL and other escapes compile, and outputs
that hold them parse and validate."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from radixcache.runtime.grammar import GrammarCompiler, GrammarError, GrammarSpec, GrammarState
from tests.runtime.grammar.conftest import token_table, walk

ROOT = "response_format.json_schema.schema"


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "object", "properties": {"\ud800": {"type": "string"}}}, ".properties.\\ud800"),
        ({"properties": {"a\udfffb": {"const": 1}}, "required": ["a\udfffb"]}, ".properties.a\\udfffb"),
        ({"type": "object", "properties": {"a": {}}, "required": ["a", "\ud800"]}, ".required[1]"),
        ({"enum": ["ok", "\udfff"]}, ".enum[1]"),
        ({"const": "a\ud800b"}, ".const"),
        ({"type": "string", "pattern": "\ud800"}, ".pattern"),
        ({"$defs": {"\ud83d": {"type": "null"}}}, ".$defs.\\ud83d"),
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_refused_where_it_is(schema: Any, path: str) -> None:
    for strict in (True, False):
        with pytest.raises(GrammarError) as info:
            GrammarSpec.json_schema(schema, strict=strict, path=ROOT)
        assert info.value.path == ROOT + path and "lone surrogate" in info.value.reason, info.value
        str(info.value).encode("utf-8")  # sendable


def test_whole_pairs_nul_and_escapes_compile_and_validate(tiny_tokenizer: Any, tiny_compiler: GrammarCompiler) -> None:
    key = '\u00e9\U0001f600\u0000q"\\'
    schema = {"type": "object", "properties": {key: {"enum": ["\u0000\n", "\U0001f600"]}}, "required": [key]}
    compiled = tiny_compiler.compile(GrammarSpec.json_schema(json.dumps(schema)))  # as escapes, and as text
    assert compiled is tiny_compiler.compile(GrammarSpec.json_schema(schema))
    table = token_table(tiny_tokenizer, tiny_compiler.vocab)
    for seed in range(3):
        value = json.loads(tiny_tokenizer.decode(walk(GrammarState(compiled), table, seed)))
        jsonschema.validate(value, schema)
        assert list(value) == [key]
