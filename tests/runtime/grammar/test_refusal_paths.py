"""A schema the grammar library refuses (unsatisfiable, an unknown format) is a GrammarError naming the subschema at
fault and the library's own reason for it, checked against the subschema the test made bad; the library alone named
the schema's root, and for a nested cause only its outermost symptom ("required property 'a' is unsatisfiable")."""

from __future__ import annotations

import jsonschema
import pytest

import radixcache.runtime.grammar.locate as locating
from radixcache.runtime.grammar import GrammarError, GrammarSpec
from radixcache.runtime.grammar.locate import MAX_TRIES

ROOT = "response_format.json_schema.schema"
BAD_RANGE = {"type": "integer", "minimum": 5, "maximum": 1}
RECURSIVE = {"n": {"$ref": "#/definitions/x"}, "m": {"format": "bad", "type": "string"}}  # required: m alone


def _object(**properties: object) -> dict[str, object]:
    return {"type": "object", "properties": properties, "required": list(properties)}


@pytest.mark.parametrize(
    ("schema", "where", "reason"),
    [
        (_object(a=_object(b=BAD_RANGE)), "properties.a.properties.b", "minimum (5) is greater than maximum (1)"),
        (_object(a={"type": "array", "items": {"type": "string", "format": "nope"}}), "properties.a.items", "nope"),
        (_object(a={"anyOf": [{"type": "string", "minLength": 3, "maxLength": 1}]}), "properties.a.anyOf[0]", "3"),
        (_object(a={"allOf": [{"type": "string"}, {"type": "integer"}]}), "properties.a", "incompatible types"),
        ({"$defs": {"x": BAD_RANGE}, **_object(a={"$ref": "#/$defs/x"})}, "$defs.x", "minimum (5)"),
        # a recursive def: the cause is its other property, not the $ref back into it (n optional: a required one
        # has no finite value, refused at its first token: test_first_token.py)
        (
            {"definitions": {"x": _object(m={"format": "bad", "type": "string"}) | {"properties": RECURSIVE}}}
            | {"$ref": "#/definitions/x"},
            "definitions.x.properties.m",
            "bad",
        ),
    ],
    ids=["nested", "format", "anyOf", "allOf", "ref", "recursive"],
)
@pytest.mark.parametrize("strict", [True, False])
def test_a_refused_schema_names_the_subschema_at_fault(
    tiny_compiler, schema: dict, where: str, reason: str, strict: bool
) -> None:
    spec = GrammarSpec.json_schema(schema, strict=strict)
    if "format" in spec.source and not strict:  # an unknown format is ignored then
        tiny_compiler.compile(spec)
        return
    with pytest.raises(GrammarError) as info:
        tiny_compiler.compile(spec)
    assert info.value.path == f"{ROOT}.{where}"
    assert reason in str(info.value)


def test_the_walk_is_bounded_and_keeps_the_root_past_it(tiny_compiler) -> None:
    """A huge schema's refusal costs at most MAX_TRIES compiles of its parts before the error is raised."""
    names = [f"p{i}" for i in range(MAX_TRIES + 8)]
    schema = _object(**{n: {"type": "integer"} for n in names[:-1]}, **{names[-1]: BAD_RANGE})
    with pytest.raises(GrammarError, match=f"required property '{names[-1]}'") as info:
        tiny_compiler.compile(GrammarSpec.json_schema(schema))
    assert info.value.path == ROOT


def test_the_calls_schema_a_tool_choice_builds_keeps_its_path(tiny_compiler) -> None:
    """Its paths name no field of the request: the spec's own path stays, with the cause's message."""
    with pytest.raises(GrammarError, match=r"minimum \(5\) is greater than maximum \(1\)") as info:
        tiny_compiler.compile(GrammarSpec.json_schema(_object(tool_calls=_object(a=BAD_RANGE)), path="tools"))
    assert info.value.path == "tools"


def test_the_walk_stops_at_its_time_budget(tiny_compiler, monkeypatch) -> None:
    """A subschema the library takes may take a second to compile (an enum of 100,000 strings): 64 of them held a
    worker thread for a minute. The clock here moves a whole budget per reading, so the walk stops at once."""
    clock = iter(range(10_000))
    monkeypatch.setattr(locating.time, "monotonic", lambda: next(clock) * (locating.BUDGET_S + 1))
    with pytest.raises(GrammarError, match="required property 'a'") as info:
        tiny_compiler.compile(GrammarSpec.json_schema(_object(a=_object(b=BAD_RANGE))))
    assert info.value.path == ROOT


TINY_STEP = {"type": "number", "multipleOf": 1e-300}
MERGED = {"allOf": [{"type": "object", "properties": {f"p{i}": {"type": "integer"}}} for i in range(1_000)]}


@pytest.mark.parametrize(
    ("schema", "where", "reason"),
    [
        (TINY_STEP, "multipleOf", "too many digits"),
        (_object(a=TINY_STEP), "properties.a.multipleOf", "too many digits"),
        (MERGED, "allOf", "schema too large"),
        (_object(x=MERGED), "properties.x.allOf", "schema too large"),
    ],
    ids=["multipleOf", "nested-multipleOf", "allOf", "nested-allOf"],
)
def test_a_refusal_names_the_keyword_not_the_subschema(tiny_compiler, schema: dict, where: str, reason: str) -> None:
    """The library's "Value for 'multipleOf' has too many digits" and "schema too large" (an allOf of 1,000 small
    objects, merged) were reported at the (sub)schema holding the keyword: the root, for the schemas sent whole."""
    with pytest.raises(GrammarError, match=reason) as info:
        tiny_compiler.compile(GrammarSpec.json_schema(schema))
    assert info.value.path == f"{ROOT}.{where}"


@pytest.mark.parametrize("fmt", ["path", "binary", "password"])  # pydantic's Path, bytes and SecretStr fields
def test_an_unknown_format_in_strict_mode_says_strict_false_ignores_it(tiny_compiler, fmt: str) -> None:
    """The OpenAI SDK and LangChain send pydantic models' schemas with strict true: a `Path` field's format was
    refused as "Unknown format: path" alone, where every other strict-only refusal says how to send it anyway."""
    schema = _object(p={"type": "string", "format": fmt, "maxLength": 4})
    with pytest.raises(GrammarError, match=rf"Unknown format: {fmt}.*send strict: false to ignore it") as info:
        tiny_compiler.compile(GrammarSpec.json_schema(schema))
    assert info.value.path == f"{ROOT}.properties.p"
    assert tiny_compiler.compile(GrammarSpec.json_schema(schema, strict=False)) is not None


OVERLAP = {"oneOf": [{"type": "integer"}, {"type": "number"}]}  # 3 matches both: no value of it may be 3


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        (OVERLAP, "oneOf"),
        (_object(x=OVERLAP), "properties.x.oneOf"),
        ({"$defs": {"u": OVERLAP}} | _object(x={"$ref": "#/$defs/u"}), "$defs.u.oneOf"),
    ],
    ids=["root", "nested", "ref"],
)
def test_a_oneof_whose_members_overlap_names_it_and_how_to_send_it(tiny_compiler, schema: dict, where: str) -> None:
    """The library refused it at the (sub)schema holding it, advising its own `coerce_one_of` option, which no
    request can set; strict: false is the way to send it (taken as anyOf)."""
    with pytest.raises(jsonschema.ValidationError, match="valid under each of"):
        jsonschema.validate(3, OVERLAP)  # the independent check: the members overlap
    with pytest.raises(GrammarError, match=r"'oneOf' cannot be enforced.*send strict: false") as info:
        tiny_compiler.compile(GrammarSpec.json_schema(schema))
    assert info.value.path == f"{ROOT}.{where}"
    assert "coerce_one_of" not in str(info.value)
    assert tiny_compiler.compile(GrammarSpec.json_schema(schema, strict=False)) is not None
    exclusive = {"oneOf": [_object(k={"const": "a"}), _object(k={"const": "b"})]}
    assert tiny_compiler.compile(GrammarSpec.json_schema(exclusive)) is not None


@pytest.mark.parametrize(
    ("schema", "strict", "where"),
    [
        ({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["nmae"]}, True, "required"),
        (_object(user=_object(a={"type": "integer"}) | {"required": ["b"]}), True, "properties.user.required"),
        (_object(a={}) | {"required": ["b"], "additionalProperties": False}, False, "required"),
    ],
    ids=["strict-typo", "nested", "closed"],
)
def test_a_required_property_the_properties_do_not_name_says_so_at_required(
    tiny_compiler, schema: dict, strict: bool, where: str
) -> None:
    """Strict mode admits only the keys an object's properties name, so a required name missing from them (a typo)
    can never be written: the library said only "required property 'nmae' is unsatisfiable", at the object."""
    with pytest.raises(GrammarError, match=r"is required but not among the object's properties") as info:
        tiny_compiler.compile(GrammarSpec.json_schema(schema, strict=strict))
    assert info.value.path == f"{ROOT}.{where}"
    merged = {"$defs": {"base": {"properties": {"a": {}}, "required": ["b"]}}, "$ref": "#/$defs/base"}
    merged |= {"type": "object", "properties": {"b": {"type": "integer"}}}  # b named beside the $ref: satisfiable
    assert tiny_compiler.compile(GrammarSpec.json_schema(merged)) is not None
