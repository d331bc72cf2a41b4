"""Tool parameters with local `$ref`s (pydantic's `$defs`, draft-4 `definitions`, a recursive `#`) keep meaning the
same once nested in the calls' schema: checked by jsonschema on the whole calls schema (valid calls pass, calls
that break a referenced definition fail), for required (two tools whose definitions share names), a named choice,
parallel calls, and the Hermes one-call schema."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from radixcache.runtime.grammar import GrammarSpec
from radixcache.runtime.tools import normalize_tool_choice, normalize_tools
from radixcache.runtime.tools.schema import one_call_schema, tool_call_schema

PICK = {  # as pydantic writes a model with an enum field and a nested model
    "$defs": {
        "Color": {"enum": ["red", "blue"], "type": "string"},
        "Box": {"type": "object", "properties": {"color": {"$ref": "#/$defs/Color"}}, "required": ["color"]},
    },
    "type": "object",
    "properties": {"color": {"$ref": "#/$defs/Color"}, "box": {"$ref": "#/$defs/Box"}},
    "required": ["color", "box"],
}
PAINT = {  # the same definition name, another meaning; draft-4 `definitions`
    "definitions": {"Color": {"type": "integer", "minimum": 0, "maximum": 9}},
    "type": "object",
    "properties": {"shade": {"$ref": "#/definitions/Color"}},
    "required": ["shade"],
}
TREE = {  # recursive through the root
    "type": "object",
    "properties": {"label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["label"],
}
TOOLS = normalize_tools(
    [
        {"type": "function", "function": {"name": n, "parameters": p}}
        for n, p in (("pick", PICK), ("paint", PAINT), ("tree", TREE))
    ]
)


def _calls(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "arguments": a} for n, a in calls]}


GOOD = [
    ("pick", {"color": "red", "box": {"color": "blue"}}),
    ("paint", {"shade": 3}),
    ("tree", {"label": "a", "children": [{"label": "b", "children": [{"label": "c"}]}]}),
]
BAD = [
    ("pick", {"color": "green", "box": {"color": "blue"}}),  # Color is pick's enum
    ("pick", {"color": "red", "box": {"color": 3}}),  # inside Box too
    ("paint", {"shade": "red"}),  # paint's Color is an integer
    ("paint", {"shade": 12}),
    ("tree", {"label": "a", "children": [{"children": []}]}),  # a child is a tree: it needs its label
]


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "one"])
def test_required_calls_schema_resolves_each_tools_definitions(parallel: bool) -> None:
    schema = tool_call_schema(TOOLS, normalize_tool_choice("required", TOOLS), parallel_tool_calls=parallel)
    jsonschema.Draft202012Validator.check_schema(schema)
    for call in GOOD:
        jsonschema.validate(_calls(call), schema)
    for call in BAD:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(_calls(call), schema)
    if parallel:
        jsonschema.validate(_calls(*GOOD), schema)


def test_a_named_choice_and_the_one_call_schema_carry_their_definitions_at_the_root() -> None:
    for name, arguments in GOOD:
        choice = normalize_tool_choice({"type": "function", "function": {"name": name}}, TOOLS)
        jsonschema.validate(_calls((name, arguments)), tool_call_schema(TOOLS, choice))
        one = one_call_schema(TOOLS, choice)
        jsonschema.validate({"name": name, "arguments": arguments}, one)
    paint = normalize_tool_choice({"type": "function", "function": {"name": "paint"}}, TOOLS)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "paint", "arguments": {"shade": "red"}}, one_call_schema(TOOLS, paint))


def test_parameters_without_refs_are_nested_unchanged() -> None:
    plain = normalize_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    schema = tool_call_schema(plain, normalize_tool_choice("required", plain))
    assert "$defs" not in schema
    assert schema["properties"]["tool_calls"]["items"]["properties"]["arguments"] == {"type": "object"}


@pytest.mark.parametrize("field", ["default", "enum", "const", "examples"])
def test_a_property_named_like_a_keyword_has_its_refs_rewritten(field: str) -> None:
    """Property names were taken for keywords: a field called `default` (or `enum`, `const`, `examples`) was left
    as data, so its `$ref` kept pointing at the parameters' own `$defs`, which are gone once nested: "reference
    '#/$defs/Mode' points nowhere", and a valid pydantic tool could not be called under "required"."""
    params = {
        "$defs": {"Mode": {"enum": ["fast", "safe"], "type": "string"}},
        "type": "object",
        "properties": {field: {"$ref": "#/$defs/Mode"}, "key": {"type": "string"}},
        "required": [field, "key"],
    }
    tools = normalize_tools([{"type": "function", "function": {"name": "get_config", "parameters": params}}])
    schema = tool_call_schema(tools, normalize_tool_choice("required", tools))
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(_calls(("get_config", {field: "fast", "key": "k"})), schema)
    with pytest.raises(jsonschema.ValidationError):  # Mode still holds: a ref that points nowhere fails to resolve
        jsonschema.validate(_calls(("get_config", {field: "slow", "key": "k"})), schema)


def test_definitions_of_tools_whose_names_meet_stay_apart() -> None:
    """Definitions moved to the root as `<tool>__<name>`: tool "a"'s "b__c" and tool "a__b"'s "c" were one key, the
    later kept, so tool a's integer took a string (the grammar forced arguments tool a refuses). Each tool's
    definitions are checked against its own parameters here, and the whole schema compiles for the grammar."""
    a = {"$defs": {"b__c": {"type": "integer"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/b__c"}}}
    ab = {"$defs": {"c": {"type": "string"}}, "type": "object", "properties": {"y": {"$ref": "#/$defs/c"}}}
    root = {"type": "object", "properties": {"z": {"$ref": "#"}}}  # refers to its own parameters
    named = (("a", a), ("a__b", ab), ("a__", root))
    tools = normalize_tools([{"type": "function", "function": {"name": n, "parameters": p}} for n, p in named])
    schema = tool_call_schema(tools, normalize_tool_choice("required", tools))
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(_calls(("a", {"x": 1}), ("a__b", {"y": "s"}), ("a__", {"z": {"z": {}}})), schema)
    for bad in [("a", {"x": "s"}), ("a__b", {"y": 1}), ("a__", {"z": 1})]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(_calls(bad), schema)
    GrammarSpec.json_schema(schema)  # llguidance takes the keys as they are
