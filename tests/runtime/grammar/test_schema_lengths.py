"""A string length past the grammar library's 32-bit count: the library writes `minLength` and `maxLength` as a regex
count, and refused one past 2**32 - 1 (a generator's "no bound" of 2**63 - 1 among them) at the schema's root, or a
forced tool's whole `tools`, with a regex parse error of its own making ("(?s:.{0,4294967296}) ... decimal literal
invalid"). It is refused at its keyword; a tool only shown to the model keeps it."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.engine.tool_calls import request_grammar
from radixcache.runtime.grammar import GrammarCompiler, GrammarError, GrammarSpec, GrammarState
from radixcache.runtime.server.protocol import ChatCompletionRequest
from radixcache.runtime.server.structured import grammar_of, tool_use_of
from radixcache.runtime.tools import TemplateFeatures
from tests.runtime.grammar.conftest import token_table, walk

LIMIT = 2**32 - 1


def _tool_grammar(schema: dict[str, Any], choice: str) -> GrammarSpec | None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    tool["function"]["parameters"].update(properties={"id": schema}, required=["id"])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool], "tool_choice": choice}
    request = ChatCompletionRequest.model_validate(body)
    return request_grammar(
        RequestOptions(grammar=grammar_of(request), tool_use=tool_use_of(request)), TemplateFeatures()
    )


@pytest.mark.parametrize(
    ("schema", "where", "fix"),
    [
        ({"type": "string", "maxLength": 2**63 - 1}, "maxLength", "leave it out"),
        ({"type": "string", "minLength": 2, "maxLength": LIMIT + 1}, "maxLength", "leave it out"),
        ({"anyOf": [{"type": "null"}, {"type": "string", "minLength": 2**40}]}, "anyOf[1].minLength", "that long"),
    ],
)
def test_a_string_length_past_a_32_bit_count_is_refused_at_its_keyword_on_every_route(
    tiny_compiler: GrammarCompiler, schema: dict[str, Any], where: str, fix: str
) -> None:
    with pytest.raises(GrammarError, match=f"only up to {LIMIT} .*{fix}") as e:
        tiny_compiler.compile(GrammarSpec.json_schema(schema, path="s"))
    assert e.value.path == f"s.{where}"
    with pytest.raises(GrammarError, match=f"only up to {LIMIT}") as e:
        _tool_grammar(schema, "required")
    assert e.value.path == f"tools[0].function.parameters.properties.id.{where}"
    assert _tool_grammar(schema, "auto") is None  # only shown to the model: no grammar counts it


def test_a_string_length_at_the_count_compiles_and_bounds_the_output(tiny_compiler, tiny_tokenizer) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": LIMIT}}, "required": ["s"]}
    schema["properties"]["t"] = {"type": "string", "minLength": 1, "maxLength": 2}
    schema["required"].append("t")
    state = GrammarState(tiny_compiler.compile(GrammarSpec.json_schema(schema)))
    out = json.loads(tiny_tokenizer.decode(walk(state, token_table(tiny_tokenizer, tiny_compiler.vocab), 0)))
    jsonschema.validate(out, schema)


@pytest.mark.parametrize("keyword", ["not", "if", "contains", "propertyNames"])
def test_a_long_count_where_no_grammar_counts_it_stays_accepted(tiny_compiler: GrammarCompiler, keyword: str) -> None:
    """Under strict: false the library ignores these keywords' subschemas, so their counts reach no regex."""
    tiny_compiler.compile(GrammarSpec.json_schema({keyword: {"maxLength": 2**63 - 1}}, strict=False))
