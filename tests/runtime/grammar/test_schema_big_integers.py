"""Integers a 64-bit float cannot hold: the grammar library reads a schema's numbers as 64-bit floats, so a `const`
or `enum` integer past 2**53 that no float holds was forced rounded (`{"const": 2**53 + 1}` wrote 9007199254740992,
a 200 whose answer fails its own schema), one of 2**63 or more was written as a float's digits, and a bound no float
holds (`minimum` 2**53 + 1) admitted a number it excludes, as did an integer's exclusive bound whose first integer
inside no float holds (`exclusiveMinimum` 2**53 admitted 2**53). They are refused naming the value's path; integers a
float holds exactly, however large, are written as themselves."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from radixcache.runtime.engine.options import RequestOptions
from radixcache.runtime.engine.tool_calls import request_grammar
from radixcache.runtime.grammar import GrammarCompiler, GrammarError, GrammarSpec, GrammarState
from radixcache.runtime.grammar.schema_check import check_schema
from radixcache.runtime.server.protocol import ChatCompletionRequest
from radixcache.runtime.server.structured import grammar_of, tool_use_of
from radixcache.runtime.tools import TemplateFeatures
from tests.runtime.grammar.conftest import token_table, walk

BIG = 2**53 + 1  # the first integer no 64-bit float holds
REFUSED = [
    ({"properties": {"id": {"const": BIG}}}, "properties.id.const"),
    ({"enum": ["a", {"ids": [1, 2**62 + 1]}]}, "enum[1].ids[1]"),
    ({"const": 2**63}, "const"),  # a float holds it, but the library writes 9223372036854776000
    ({"type": "integer", "minimum": BIG}, "minimum"),
    ({"type": "number", "exclusiveMaximum": -BIG}, "exclusiveMaximum"),
    ({"properties": {"default": {"const": BIG}}}, "properties.default.const"),  # a property, not the keyword
    ({"$defs": {"n": {"enum": [BIG]}}, "$ref": "#/$defs/n"}, "$defs.n.enum[0]"),
    # the first integer inside an exclusive bound, computed as a float: 2**53 + 1 read 2**53, which it admitted
    ({"type": "integer", "exclusiveMinimum": 2**53}, "exclusiveMinimum"),
    ({"type": ["integer", "null"], "exclusiveMaximum": -(2**60), "minimum": -(2**61)}, "exclusiveMaximum"),
]


@pytest.mark.parametrize(("schema", "where"), REFUSED)
def test_an_integer_no_float_holds_is_refused_naming_it(schema: dict[str, Any], where: str) -> None:
    path = "response_format.json_schema.schema"
    with pytest.raises(GrammarError, match="exactly") as e:
        GrammarSpec.from_response_format({"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert e.value.path == f"{path}.{where}"
    with pytest.raises(GrammarError) as e:  # a tool's parameters take the same check
        check_schema({"type": "object", "properties": {"x": schema}}, "tools[0].function.parameters")
    assert e.value.path.startswith("tools[0].function.parameters.properties.x.")


@pytest.mark.parametrize("value", [2**53, 3 * 2**60, -(2**62), 10**18, -BIG + 1])
def test_an_integer_a_float_holds_is_written_as_itself(tiny_compiler: GrammarCompiler, tiny_tokenizer, value) -> None:
    schema = {"type": "object", "properties": {"id": {"const": value}, "n": {"enum": [value]}}, "required": ["id", "n"]}
    state = GrammarState(tiny_compiler.compile(GrammarSpec.json_schema(schema)))
    out = json.loads(tiny_tokenizer.decode(walk(state, token_table(tiny_tokenizer, tiny_compiler.vocab), 0)))
    assert out == {"id": value, "n": value}
    jsonschema.validate(out, schema)


def test_data_the_grammar_does_not_write_and_the_int64_maximum_stay_accepted(tiny_compiler: GrammarCompiler) -> None:
    schema = {"type": "integer", "maximum": 2**63 - 1, "default": BIG, "examples": [BIG + 2]}
    tiny_compiler.compile(GrammarSpec.json_schema(schema))  # the maximum is clamped back to itself by the library


TOOL = {
    "type": "function",
    "function": {
        "name": "get",
        "parameters": {"type": "object", "properties": {"id": {"enum": [BIG, 1]}}, "required": ["id"]},
    },
}


@pytest.mark.parametrize(
    ("choice", "answer", "refused"),
    [("auto", None, False), ("none", None, False), ("required", None, True), ("auto", {"type": "json_object"}, True)],
)
def test_a_tools_integer_is_refused_only_where_a_grammar_writes_it(choice: str, answer: Any, refused: bool) -> None:
    """A tool only shown to the model (tool_choice "auto" or "none", no constraint) keeps its integers: refused
    there too, a valid schema was a 400 for no grammar's sake; a call a grammar forces refuses them, named."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL], "tool_choice": choice}
    if answer is not None:
        body["response_format"] = answer
    request = ChatCompletionRequest.model_validate(body)
    use = tool_use_of(request)  # the server's check of every tool's parameters: as JSON schemas only
    options = RequestOptions(grammar=grammar_of(request), tool_use=use)
    if not refused:
        assert request_grammar(options, TemplateFeatures()) is None
        return
    with pytest.raises(GrammarError, match="exactly") as e:
        request_grammar(options, TemplateFeatures())
    assert e.value.path == "tools[0].function.parameters.properties.id.enum[0]"


ONE_SIDED = [
    ({"type": "integer", "minimum": 10**18}, "minimum", "maximum"),
    ({"type": "integer", "minimum": 1e18}, "minimum", "maximum"),  # a float given for an integer bound
    ({"type": "number", "minimum": 0, "exclusiveMinimum": 2e18}, "exclusiveMinimum", "maximum"),
    ({"properties": {"a": {"type": "number", "maximum": -1e18}}}, "properties.a.maximum", "minimum"),
    (
        {"properties": {"b": {"type": "number", "exclusiveMaximum": -(2**62)}}},
        "properties.b.exclusiveMaximum",
        "minimum",
    ),
]


@pytest.mark.parametrize(("schema", "where", "add"), ONE_SIDED)
def test_a_one_sided_bound_past_1e18_is_refused_at_its_keyword(
    tiny_compiler: GrammarCompiler, schema: dict[str, Any], where: str, add: str
) -> None:
    """The library builds a one-sided range's regex only below 10**18: it refused these at the schema's root, as
    "Failed to generate regex for integer range", naming no field and no way out."""
    with pytest.raises(GrammarError, match=f"without a {add} too") as e:
        tiny_compiler.compile(GrammarSpec.json_schema(schema, path="s"))
    assert e.value.path == f"s.{where}"


def test_a_bound_past_1e18_with_the_other_bound_compiles_exactly(tiny_compiler, tiny_tokenizer) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1e18, "maximum": 2**63 - 1}}}
    schema["required"] = ["n"]
    state = GrammarState(tiny_compiler.compile(GrammarSpec.json_schema(schema)))
    for seed in range(3):
        out = json.loads(tiny_tokenizer.decode(walk(state, token_table(tiny_tokenizer, tiny_compiler.vocab), seed)))
        jsonschema.validate(out, schema)
        state = GrammarState(tiny_compiler.compile(GrammarSpec.json_schema(schema)))


@pytest.mark.parametrize(
    ("schema", "admitted", "excluded"),
    [
        ({"type": "integer", "exclusiveMinimum": 2**53 - 1}, 2**53, 2**53 - 1),
        ({"type": "integer", "exclusiveMaximum": 2**53, "minimum": 0}, 2**53 - 1, 2**53),
        ({"type": "number", "exclusiveMinimum": 2**53}, 2**53 + 2, 2**53),
    ],
)
def test_an_exclusive_bound_whose_first_integer_a_float_holds_is_exact(
    tiny_compiler: GrammarCompiler, tiny_tokenizer, schema: dict[str, Any], admitted: int, excluded: int
) -> None:
    compiled = tiny_compiler.compile(GrammarSpec.json_schema(schema))

    def accepts(value: int) -> bool:
        matcher = compiled.new_matcher()
        return all(matcher.consume_token(t) for t in tiny_tokenizer.encode(str(value))) and matcher.is_accepting()

    assert (accepts(admitted), accepts(excluded)) == (True, False)


def test_a_tools_one_sided_bound_past_1e18_is_named_at_its_field() -> None:
    """A forced call's schema is the runtime's, so the library's refusal named only `tools`."""
    tool = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}
    tool["function"]["parameters"]["properties"] = {"id": {"type": "integer", "minimum": 10**18}}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool], "tool_choice": "required"}
    request = ChatCompletionRequest.model_validate(body)
    options = RequestOptions(grammar=grammar_of(request), tool_use=tool_use_of(request))
    with pytest.raises(GrammarError, match="without a maximum too") as e:
        request_grammar(options, TemplateFeatures())
    assert e.value.path == "tools[0].function.parameters.properties.id.minimum"


def _forced_tool_grammar(schema: dict[str, Any]) -> GrammarSpec | None:
    """A forced tool's grammar, its one parameter `id` of `schema` (the server's checks, then the engine's)."""
    tool = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}
    tool["function"]["parameters"].update(properties={"id": schema}, required=["id"])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool], "tool_choice": "required"}
    request = ChatCompletionRequest.model_validate(body)
    return request_grammar(
        RequestOptions(grammar=grammar_of(request), tool_use=tool_use_of(request)), TemplateFeatures()
    )


SPLIT_ONE_SIDED = [
    ({"allOf": [{"minimum": 10**18}, {"type": "integer"}]}, "allOf[0].minimum", "maximum"),
    ({"type": "integer", "allOf": [{"exclusiveMinimum": 2 * 10**18}]}, "allOf[0].exclusiveMinimum", "maximum"),
    ({"allOf": [{"type": "integer"}, {"allOf": [{"maximum": -(2**62)}]}]}, "allOf[1].allOf[0].maximum", "minimum"),
    (
        {"anyOf": [{"allOf": [{"type": ["integer", "null"]}, {"minimum": 1e18}]}]},
        "anyOf[0].allOf[1].minimum",
        "maximum",
    ),
]


@pytest.mark.parametrize(("schema", "where", "add"), SPLIT_ONE_SIDED)
def test_a_one_sided_integer_bound_split_across_all_of_is_refused_at_its_keyword_on_every_route(
    tiny_compiler: GrammarCompiler, schema: dict[str, Any], where: str, add: str
) -> None:
    """The library merges an `allOf`'s members: the integer type in one member and a bound past 10**18 in another
    is the one-sided range it cannot build. The check read each member alone, so a forced tool's 400 named only
    `tools`, and response_format's said "a number" of an integer."""
    with pytest.raises(GrammarError, match=f"cannot bound an integer .* without a {add} too") as e:
        tiny_compiler.compile(GrammarSpec.json_schema(schema, path="s"))
    assert e.value.path == f"s.{where}"
    with pytest.raises(GrammarError, match=f"cannot bound an integer .* without a {add} too") as e:
        _forced_tool_grammar(schema)
    assert e.value.path == f"tools[0].function.parameters.properties.id.{where}"


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 10**18, "allOf": [{"maximum": 2**62}]},
        {"allOf": [{"type": "integer", "maximum": -(10**18)}, {"minimum": -(2**62)}]},
    ],
)
def test_an_integer_bound_past_1e18_with_its_other_side_in_an_all_of_compiles_on_every_route(
    tiny_compiler: GrammarCompiler, tiny_tokenizer, schema: dict[str, Any]
) -> None:
    """Bounded on both sides once the library merges the `allOf`: it builds the range, but the check, reading the
    schema without its members, refused it as one-sided (a 400 for a schema the grammar enforces)."""
    wrapped = {"type": "object", "properties": {"id": schema}, "required": ["id"]}
    state = GrammarState(tiny_compiler.compile(GrammarSpec.json_schema(wrapped)))
    out = json.loads(tiny_tokenizer.decode(walk(state, token_table(tiny_tokenizer, tiny_compiler.vocab), 0)))
    jsonschema.validate(out, wrapped)
    tool = _forced_tool_grammar(schema)
    assert tool is not None and tiny_compiler.compile(tool) is not None


@pytest.mark.parametrize(
    ("schema", "where", "add"),
    [
        ({"type": "number", "minimum": 1e18}, "minimum", "maximum"),
        ({"type": ["number", "null"], "exclusiveMaximum": -(2**62)}, "exclusiveMaximum", "minimum"),
        ({"allOf": [{"type": "number"}, {"minimum": 2e18}]}, "allOf[1].minimum", "maximum"),
    ],
)
def test_a_tools_one_sided_number_bound_past_1e18_is_named_at_its_field(
    schema: dict[str, Any], where: str, add: str
) -> None:
    """An integer's was named at the tool's parameter, a number's only as `tools` (the calls schema's path)."""
    with pytest.raises(GrammarError, match=f"cannot bound a number .* without a {add} too") as e:
        _forced_tool_grammar(schema)
    assert e.value.path == f"tools[0].function.parameters.properties.id.{where}"
