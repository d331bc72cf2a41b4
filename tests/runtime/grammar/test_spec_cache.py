"""Grammar specs and the compiled-grammar cache: an invalid schema, regex or grammar raises GrammarError naming the
path of the mistake (never a raw library exception); OpenAI response_format shapes map to specs; equal specs with
different key order share one cached compiled object, `properties` order is kept; the cache is a bounded LRU and
concurrent compiles of one spec return one object."""

from __future__ import annotations

import threading

import pytest

from radixcache.runtime.grammar import GrammarCompiler, GrammarError, GrammarSpec
from tests.runtime.grammar.schemas import NESTED

ROOT = "response_format.json_schema.schema"


def rf(schema: object, strict: bool | None = True) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": strict}}


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "object", "properties": {"age": {"type": "integr"}}}, f"{ROOT}.properties.age.type"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}, f"{ROOT}.properties.a.$ref"),
        ({"type": "array", "items": {"type": "string", "pattern": "(["}}, f"{ROOT}.items.pattern"),
        ({"type": "object", "required": "name"}, f"{ROOT}.required"),
        ({"anyOf": []}, f"{ROOT}.anyOf"),
        (
            {"type": "object", "properties": {"t": {"type": "array", "items": [{"type": 3}]}}},
            f"{ROOT}.properties.t.items[0].type",
        ),
        ({"type": "string", "maxLength": -1}, f"{ROOT}.maxLength"),
        ({"properties": {"x": 5}}, f"{ROOT}.properties.x"),
        ("{not json", ROOT),
        ({"type": "string", "pattern": "a\ud800"}, f"{ROOT}.pattern"),  # a lone surrogate: no UTF-8 for the library
        ('{"items": {"pattern": "\\udfff"}}', f"{ROOT}.items.pattern"),
        # the library's own options: `item_separator: "!!"` made `{"a"=1!!"b"=2}`, `lenient` undid strict
        ({"type": "object", "x-guidance": {"item_separator": "!!", "key_separator": "="}}, f"{ROOT}.x-guidance"),
        ({"properties": {"a": {"type": "array", "x-guidance": {"lenient": True}}}}, f"{ROOT}.properties.a.x-guidance"),
        ({"prefixItems": [{}], "$ref": "#/prefixItems/\u00b2"}, f"{ROOT}.$ref"),  # a digit int() cannot read
        # bounds past 64 bits: "Value is not JSON serializable" with no path, or a crash of the process (-2**63)
        (
            {"properties": {"n": {"type": "integer", "minimum": 10**30, "maximum": 10**30 + 5}}},
            f"{ROOT}.properties.n.minimum",
        ),
        ({"type": "integer", "minimum": -(2**63), "maximum": -(2**63) + 5}, f"{ROOT}.minimum"),
        ({"type": "integer", "minimum": 0, "maximum": -1e19}, f"{ROOT}.maximum"),
        ({"type": "number", "multipleOf": 10**400}, f"{ROOT}.multipleOf"),
        ('{"type": "number", "exclusiveMaximum": Infinity}', f"{ROOT}.exclusiveMaximum"),
    ],
)
def test_invalid_schema_names_its_path(schema: object, path: str) -> None:
    with pytest.raises(GrammarError) as info:
        GrammarSpec.from_response_format(rf(schema))
    assert info.value.path == path and str(info.value).startswith(path)


def test_invalid_response_format_shapes() -> None:
    with pytest.raises(GrammarError, match=r"^response_format\.type:"):
        GrammarSpec.from_response_format({"type": "xml"})
    with pytest.raises(GrammarError, match=r"^response_format\.json_schema:"):
        GrammarSpec.from_response_format({"type": "json_schema"})
    with pytest.raises(GrammarError, match=r"^response_format\.json_schema\.strict:"):
        GrammarSpec.from_response_format(rf({"type": "object"}, strict="yes"))  # type: ignore[arg-type]
    assert GrammarSpec.from_response_format({"type": "text"}) is None
    assert GrammarSpec.from_response_format({"type": "json_object"}) == GrammarSpec.json_object()


@pytest.mark.parametrize(
    ("response_format", "path"),
    [
        ({"type": "json_object", "schema": {"type": "array"}}, "response_format.schema"),
        ({"type": "text", "json_schema": {"schema": {}}}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "shcema": {"type": "array"}}},
            "response_format.json_schema.shcema",
        ),
        ({"type": "json_schema", "json_schema": {"schema": {}}, "strict": True}, "response_format.strict"),
    ],
)
def test_a_key_the_format_does_not_read_is_refused_by_its_path(response_format: dict, path: str) -> None:
    """A `schema` beside json_object, or a misspelt `schema`, was dropped: the output was constrained to any object
    (or nothing) while the caller believed it followed their schema."""
    with pytest.raises(GrammarError) as info:
        GrammarSpec.from_response_format(response_format)
    assert info.value.path == path and "unknown field" in str(info.value)
    described = {"name": "x", "description": "d", "schema": {"type": "array"}, "strict": False}
    assert GrammarSpec.from_response_format(
        {"type": "json_schema", "json_schema": described}
    ) == GrammarSpec.json_schema({"type": "array"}, strict=False)


def test_library_errors_become_grammar_errors(tiny_compiler) -> None:
    bad = [
        GrammarSpec.regex("a(b", path="regex"),
        GrammarSpec.ebnf('root ::= "a" missing', path="ebnf"),
        GrammarSpec.ebnf("start: ( unbalanced", path="ebnf"),
    ]
    for spec in bad:
        with pytest.raises(GrammarError) as info:
            tiny_compiler.compile(spec)
        assert info.value.path == spec.path
    unenforceable = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(GrammarError) as info:
        tiny_compiler.compile(GrammarSpec.from_response_format(rf(unenforceable)))
    assert info.value.path == f"{ROOT}.properties.tags.uniqueItems"
    # strict=False ignores a keyword the grammar cannot enforce
    tiny_compiler.compile(GrammarSpec.from_response_format(rf(unenforceable, strict=False)))


def test_equal_specs_in_another_key_order_share_one_compiled_grammar(tiny_compiler) -> None:
    reordered = {k: NESTED[k] for k in reversed(list(NESTED))}
    reordered["properties"] = dict(NESTED["properties"])
    reordered["properties"]["owner"] = {
        k: NESTED["properties"]["owner"][k] for k in reversed(NESTED["properties"]["owner"])
    }
    a = GrammarSpec.from_response_format(rf(NESTED))
    b = GrammarSpec.from_response_format(rf(reordered))
    assert a == b and a.key == b.key
    assert tiny_compiler.compile(a) is tiny_compiler.compile(b)
    # the order of `properties` is the order fields are generated in: a different order is a different grammar
    swapped = dict(NESTED, properties=dict(reversed(list(NESTED["properties"].items()))))
    assert GrammarSpec.json_schema(swapped).key != a.key
    assert GrammarSpec.json_schema(NESTED, strict=False).key != a.key


@pytest.mark.parametrize("where", ["$defs", "definitions", "patternProperties"])
def test_a_subschema_named_properties_keeps_the_order_of_its_fields(where: str) -> None:
    """Canonical JSON keeps the order of a `properties` map (the order fields are generated in) and sorts the rest.
    It knew a `properties` map by its name alone, so a def (or a pattern) called "properties" was taken for one: its
    own keywords kept their order and its real `properties` were sorted, the fields then generated as a, z."""
    fields = {"z": {"const": 1}, "a": {"const": 2}}
    spec = GrammarSpec.json_schema({where: {"properties": {"type": "object", "properties": fields}}})
    assert list(spec.schema()[where]["properties"]["properties"]) == ["z", "a"]
    reordered = GrammarSpec.json_schema({where: {"properties": {"properties": fields, "type": "object"}}})
    assert reordered.key == spec.key


def test_cache_is_a_bounded_lru(tiny_compiler) -> None:
    compiler = GrammarCompiler(tiny_compiler.vocab, max_entries=2)
    x, y, z = (GrammarSpec.regex(p) for p in ("x+", "y+", "z+"))
    cx = compiler.compile(x)
    compiler.compile(y)
    assert compiler.compile(x) is cx  # x is now the most recent
    compiler.compile(z)  # evicts y
    assert len(compiler) == 2 and compiler.compile(x) is cx
    misses = compiler.misses
    compiler.compile(y)
    assert compiler.misses == misses + 1


def test_concurrent_compiles_return_one_object(tiny_compiler) -> None:
    compiler = GrammarCompiler(tiny_compiler.vocab)
    spec = GrammarSpec.json_schema(NESTED)
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(compiler.compile(spec))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r is results[0] for r in results)


def _nested(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize(
    "schema",
    [_nested(2000), "[" * 100_000, '{"items": ' * 5000 + "{}" + "}" * 5000],
    ids=["dict", "text of brackets", "text of items"],
)
def test_a_schema_nested_past_the_librarys_depth_is_a_grammar_error(schema: object) -> None:
    """The schema walks recurse per level: a schema a few hundred levels deep (the server refuses it, but the
    engine's API takes it as given) escaped as a RecursionError, never a GrammarError. The library's own parser
    refuses any schema over about 124 levels, so that is the limit, checked without recursing."""
    with pytest.raises(GrammarError, match="nests more than") as info:
        GrammarSpec.json_schema(schema)
    assert info.value.path == ROOT


def test_a_schema_as_deep_as_the_library_takes_compiles(tiny_compiler) -> None:
    tiny_compiler.compile(GrammarSpec.json_schema(_nested(120)))


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}, f"{ROOT}.minProperties"),
        ({"properties": {"m": {"type": "object", "minProperties": 3}}}, f"{ROOT}.properties.m.minProperties"),
        (
            {"type": "object", "patternProperties": {"^x": {}}, "additionalProperties": False, "minProperties": 2},
            f"{ROOT}.minProperties",
        ),
    ],
)
def test_strict_refuses_a_min_properties_that_repeated_keys_would_meet(tiny_compiler, schema: dict, path: str) -> None:
    """Where an object's keys are open the grammar cannot keep a key from repeating, and it counts what it wrote:
    strict mode compiled such a `minProperties` and let `{"": 0, "": 0}` through, which parses as one property and
    fails the schema. Strict refuses it like the other keywords it cannot enforce; lenient ignores it."""
    with pytest.raises(GrammarError, match="'minProperties' cannot be enforced") as info:
        tiny_compiler.compile(GrammarSpec.from_response_format(rf(schema)))
    assert info.value.path == path
    tiny_compiler.compile(GrammarSpec.from_response_format(rf(schema, strict=False)))
    closed = {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"], "minProperties": 2}
    tiny_compiler.compile(GrammarSpec.from_response_format(rf(closed)))  # fixed keys cannot repeat
    tiny_compiler.compile(GrammarSpec.from_response_format(rf({"type": "object", "minProperties": 1})))


def test_a_cached_grammar_names_each_callers_own_path(tiny_compiler, tiny_tokenizer) -> None:
    """The cache key leaves out the spec's path, so a second request with an equal spec got the first request's
    compiled grammar and its errors mid-decode named the first request's field (`tools[3]...` for a
    `response_format`). A hit now carries the caller's spec: same grammar, no second compile, its own path."""
    from radixcache.runtime.grammar import GrammarState

    compiler = GrammarCompiler(tiny_compiler.vocab)
    first = compiler.compile(GrammarSpec.regex("ab", path="tools[3].function.parameters"))
    misses = compiler.misses
    again = compiler.compile(GrammarSpec.regex("ab", path="regex"))
    assert compiler.misses == misses and again.grammar == first.grammar
    assert (first.spec.path, again.spec.path) == ("tools[3].function.parameters", "regex")
    assert compiler.compile(GrammarSpec.regex("ab", path="regex")).spec.path == "regex"
    state = GrammarState(again)
    (bad,) = tiny_tokenizer.encode("b")
    with pytest.raises(GrammarError) as info:
        state.accept(bad)  # "b" before "a": not allowed
    assert info.value.path == "regex"


def test_a_bound_past_64_bits_says_so_and_one_inside_compiles(tiny_compiler) -> None:
    with pytest.raises(GrammarError, match=r"bounds must fit in 64 bits"):
        GrammarSpec.json_schema({"type": "integer", "minimum": 10**30, "maximum": 10**30 + 5})
    tiny_compiler.compile(GrammarSpec.json_schema({"type": "integer", "minimum": -(2**62), "maximum": 2**62}))
    tiny_compiler.compile(GrammarSpec.json_schema({"type": "number", "minimum": -1e18, "maximum": 1.5e18}))


def test_the_int64_maximum_is_a_maximum_the_grammar_keeps_exactly(tiny_compiler, tiny_tokenizer) -> None:
    """`maximum: 2**63 - 1` (Long.MAX_VALUE, as generated schemas write it) was refused by the 64-bit check (its float
    is 2**63); the library keeps that bound exactly: the value itself is accepted, one more is not."""
    from radixcache.runtime.grammar.state import GrammarState

    compiled = tiny_compiler.compile(GrammarSpec.json_schema({"type": "integer", "minimum": 0, "maximum": 2**63 - 1}))

    def accepts(text: str) -> bool:
        state = GrammarState(compiled)
        for token in tiny_tokenizer.encode(text, add_special_tokens=False):
            try:
                state.accept(token)
            except GrammarError:
                return False
        return state.is_complete()

    assert accepts(str(2**63 - 1)) and accepts("42")
    assert not accepts(str(2**63))


def test_a_number_the_library_cannot_take_is_named_by_its_path(tiny_compiler) -> None:
    """Data too (a default, an enum): an int past 64 bits was "Value is not JSON serializable" with no path, and an
    integer const or enum value the library reads as a float at or below -2**63 crashed the process."""
    for schema, where in [
        ({"type": "integer", "default": 10**30}, "default"),
        ({"properties": {"a": {"enum": [1, -(2**63) - 1]}}}, "properties.a.enum[1]"),
        ({"const": {"x": [2**64]}}, "const.x[0]"),
        ({"enum": [{"a": -(2**63) + 1}]}, "enum[0].a"),  # the float -2**63 to the library: a crash (segfault)
        ({"type": "integer", "enum": [3, -1e19]}, "enum[1]"),  # a crash too
    ]:
        with pytest.raises(GrammarError, match=r"numbers must be above -2\*\*63, and integers fit in 64 bits") as info:
            GrammarSpec.json_schema(schema, path=ROOT)
        assert info.value.path == f"{ROOT}.{where}"
    # the largest a float holds exactly and the library writes as itself (2**64 - 1 it wrote 18446744073709552000:
    # refused, test_schema_big_integers.py)
    tiny_compiler.compile(GrammarSpec.json_schema({"enum": [2**63 - 1024, -(2**63) + 1024, {"a": 2**62}]}))


def test_cache_is_keyed_by_namespace_within_one_bound(tiny_compiler) -> None:
    """A tenant never reuses another namespace's compile (its time would tell the other used the spec); all
    namespaces share the one bound."""
    compiler = GrammarCompiler(tiny_compiler.vocab, max_entries=2)
    spec = GrammarSpec.regex("x+")
    a = compiler.compile(spec, namespace="a")
    b = compiler.compile(spec, namespace="b")
    assert a is not b and compiler.misses == 2 and compiler.hits == 0
    assert compiler.compile(spec, namespace="a") is a and compiler.hits == 1
    compiler.compile(spec)  # the keyless namespace: a third entry, evicting a (held entries the longest)
    assert len(compiler) == 2 and compiler.misses == 3
    assert compiler.compile(spec, namespace="a") is not a and compiler.misses == 4


def test_a_tenant_flooding_new_schemas_evicts_its_own_grammars_not_others(tiny_compiler) -> None:
    """The bound is shared fairly: a tenant compiling schema after schema (an agent with ever new tool schemas)
    evicted every other tenant's grammars under a plain LRU (their next request compiled again, and the flooder
    could time their recompiles); past the bound the namespace holding the most loses its own oldest."""
    compiler = GrammarCompiler(tiny_compiler.vocab, max_entries=4)
    mine = [compiler.compile(GrammarSpec.regex(p), namespace="quiet") for p in ("a+", "b+")]
    for i in range(20):
        compiler.compile(GrammarSpec.regex(f"x{i}+"), namespace="flood")
    assert len(compiler) == 4
    hits = compiler.hits
    assert [compiler.compile(GrammarSpec.regex(p), namespace="quiet") for p in ("a+", "b+")] == mine
    assert compiler.hits == hits + 2
    assert compiler.compile(GrammarSpec.regex("x19+"), namespace="flood") is not None and compiler.hits == hits + 3
